// Type declarations for @presence/client (protocol version 1).

/** Connection status of a client. */
export type ClientStatus = "connecting" | "open" | "reconnecting" | "closed";

/** Status of a room. `left`, `revoked` and `failed` are final: call `client.room(id)` again for a new room object. */
export type RoomStatus = "joining" | "joined" | "rejoining" | "left" | "revoked" | "failed";

export type JSONValue = string | number | boolean | null | JSONValue[] | { [key: string]: JSONValue };

export interface Session {
  readonly id: string;
  /** Absent when the session has no state. */
  readonly state?: JSONValue;
}

/**
 * A member of a room. Frozen; an unchanged member keeps its object across
 * changes of the room. With `detail: "sessions"` every session is listed,
 * without only the sessions that have a state (a member without any has `sessions: []`).
 */
export interface Member {
  readonly user: string;
  readonly sessions: readonly Session[];
}

export interface Limits {
  readonly max_rooms: number;
  readonly max_frame_bytes: number;
  readonly max_state_bytes: number;
  readonly frame_rate: number;
  readonly frame_burst: number;
  readonly ping_interval_ms: number;
  /** Rooms a connection may watch at once. */
  readonly max_watches: number;
  /** Users per watch list. */
  readonly max_watch_users: number;
  /** The node's batching tick, ms. */
  readonly tick_ms: number;
}

/**
 * Codes of the node's error frames (docs/PROTOCOL.md, "Errors"): a
 * request's rejection, or an `error` event for a frame that answers none.
 */
export type NodeErrorCode =
  | "bad_frame" | "unknown_type" | "invalid_room" | "invalid_state" | "forbidden" | "invalid_token"
  | "invalid_page" | "invalid_detail" | "too_many_rooms" | "not_joined" | "invalid_view" | "invalid_watch"
  | "rate_limited" | "unavailable" | "revoked";

/** Codes the client makes itself (README, "Errors"). */
export type ClientErrorCode =
  /** Connecting: getToken threw or rejected. Once per run of failed connects; retried with backoff. */
  | "token_error"
  /** Connecting or refreshing: getToken returned something that is not a JWT (an HTML error page, JSON). Never sent; once per run; retried with backoff. */
  | "token_not_jwt"
  /** Connecting: `new WebSocket` threw. Once per run; retried with backoff. */
  | "connect_failed"
  /** Connecting: 3 connects in a row closed before hello (outside a drop's grace): refused in a way a browser cannot read, or no node. Once per run; backoff goes on. */
  | "connect_refused"
  /** Connecting: the node refused the token (close 4401, `closeReason` says why). Without getToken at once, and the client stops; with it at the second in a row, once, and backoff goes on. */
  | "unauthorized"
  /** Close 4001: a newer connection took the session. The client stops. */
  | "session_taken"
  /** The node speaks another protocol version. The client stops. */
  | "unsupported_version"
  /** A bug of the client while handling a frame; the frame is skipped. */
  | "internal"
  /** An error frame without a code. */
  | "unknown"
  /** Rejections: not connected, or the connection closed before the reply. */
  | "disconnected"
  /** Rejections: the client, the room or the watch is closed. */
  | "closed"
  /** Close 4004 (the server API revoked the user; the client stops), a room or watch the token no longer grants. */
  | "revoked"
  /** Checked before sending: a state over `limits.max_state_bytes` or not JSON, a bad watch list, a room not joined, a view mismatch. */
  | "invalid_state" | "invalid_watch" | "not_joined" | "invalid_view";

/** Every code a PresenceError may carry. */
export type ErrorCode = NodeErrorCode | ClientErrorCode;

/** Error of a request, an error frame, or the client (see README, "Errors"). */
export class PresenceError extends Error {
  constructor(code: ErrorCode, message?: string, extra?: object);
  readonly code: ErrorCode;
  /** From `unavailable` errors. */
  readonly retryAfterMs?: number;
  /** The request's ref, when the error answers one. */
  readonly ref?: string;
  /** The room the error is about, when known. */
  readonly room?: string;
  /** From `revoked` errors of a close 4004: until when the server refuses this user. */
  readonly revokedUntil?: Date;
  /** `connect_refused`, `unauthorized`: the close code of the last connect (1006: the browser could not read why). */
  readonly closeCode?: number;
  /** `connect_refused`, `unauthorized`: the node's close reason, when it gave one (4401: why it refused the token). */
  readonly closeReason?: string;
  /** Connect errors: what to check. */
  readonly hint?: string;
  readonly cause?: unknown;
}

export interface GetTokenInfo {
  /**
   * True when a cached token will not do: ahead of its expiry (refresh),
   * after close 4002, 4003 or 4401, after a result that was not a JWT, and
   * after a connection that failed before `hello`.
   */
  fresh: boolean;
}

export interface ClientOptions {
  /** The node's WebSocket URL: ws(s)://, or http(s):// (converted), or relative to `location`. */
  url: string;
  /**
   * Called at each connect and ahead of `token_expires`: the JWT (surrounding
   * whitespace is dropped), or nothing in dev mode. Anything else (an HTML
   * error page, JSON) is refused at once with `token_not_jwt`.
   */
  getToken?: (info: GetTokenInfo) => string | null | undefined | Promise<string | null | undefined>;
  /** Default: one per tab, in sessionStorage under "presence.session", with duplicated tabs detected. */
  sessionId?: string;
  /** Dev mode only, without getToken: the user id (`?user=`). A dev node refuses a client with neither (`unauthorized`). */
  user?: string;
  /** WebSocket constructor (Node, tests). Default: globalThis.WebSocket. */
  WebSocket?: new (url: string, protocols?: string | string[]) => WebSocketLike;

  /** App-level ping interval while open, ms. Default 15000. */
  pingIntervalMs?: number;
  /** No frame within this long after a ping: the socket is dead. Default 10000. */
  pingTimeoutMs?: number;
  /** No `hello` within this long after connecting: retry. Default 15000. */
  helloTimeoutMs?: number;
  /** The backoff resets after a connection stayed up this long after `hello`. Default 5000. */
  stableMs?: number;
  /** How long a starting tab waits for an "in use" answer to its stored id. Default 120. */
  duplicateCheckMs?: number;

  /** For tests: injected environment. Defaults are the globals. */
  setTimeout?: (fn: () => void, ms: number) => unknown;
  clearTimeout?: (handle: any) => void;
  now?: () => number;
  random?: () => number;
  crypto?: { getRandomValues<T extends ArrayBufferView | null>(array: T): T };
  storage?: { getItem(key: string): string | null; setItem(key: string, value: string): void } | null;
  BroadcastChannel?: (new (name: string) => BroadcastChannelLike) | null;
  window?: { addEventListener(type: "online", fn: () => void): void; removeEventListener?(type: "online", fn: () => void): void } | null;
}

export interface WebSocketLike {
  onmessage: ((ev: { data: any }) => void) | null;
  onclose: ((ev: { code: number; reason?: string }) => void) | null;
  onerror: ((ev: any) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}

export interface BroadcastChannelLike {
  onmessage: ((ev: { data: any }) => void) | null;
  postMessage(data: any): void;
  close(): void;
}

export interface UpdateChange {
  readonly session: string;
  /** The session's new state; undefined when cleared or gone. */
  readonly state: JSONValue | undefined;
  /** "state" | "joined" | "left" | "expired" (from events, or derived when a snapshot replaced the view). */
  readonly reason: string;
}

export interface MembershipChange {
  /** The event's reason ("joined", "left", "expired", "region_lost"), or "sync" when a snapshot replaced the view. */
  readonly reason: string;
}

export interface RoomOptions {
  /** "sessions": list every session of every member, with or without state. */
  detail?: "sessions";
  view?: "members";
  /** false: follow the room without a session in it (the token needs the `observe` claim). Default true. */
  present?: boolean;
  /** false: ask the node for one `event` frame per event instead of batches. Default true. */
  batch?: boolean;
}

export interface CountRoomOptions {
  /** The member count instead of the members. */
  view: "count";
  /** false: follow the count without being counted (the token needs the `observe` claim). Default true. */
  present?: boolean;
}

export interface RoomEvents {
  sync: (members: readonly Member[]) => void;
  join: (member: Member, change: MembershipChange) => void;
  leave: (member: Member, change: MembershipChange) => void;
  update: (member: Member, change: UpdateChange) => void;
  status: (status: RoomStatus) => void;
  error: (err: PresenceError) => void;
}

export interface Room {
  readonly id: string;
  readonly view: "members";
  readonly detail: "sessions" | undefined;
  /** False when joined with `present: false`: then setState rejects with `not_joined`. */
  readonly present: boolean;
  readonly status: RoomStatus;
  /** The view's region: "global", or a region's name (e.g. a global node serving its region's view). */
  readonly region: string | undefined;
  /** Number of members in the view. */
  readonly total: number;
  /** True when joined and every page of a large room has been read. */
  readonly complete: boolean;
  /** Why the room failed, when status is "failed". */
  readonly error: PresenceError | undefined;
  /** The last state passed to setState (re-sent after reconnects unless null). */
  readonly state: JSONValue | null;

  /** Members sorted by user. The same frozen array until the view changes. */
  members(): readonly Member[];
  /** Same as members(); for React's useSyncExternalStore. */
  getSnapshot(): readonly Member[];
  /** Calls listener whenever getSnapshot() changes. Returns unsubscribe. */
  subscribe(listener: () => void): () => void;

  on<K extends keyof RoomEvents>(type: K, fn: RoomEvents[K]): () => void;
  off<K extends keyof RoomEvents>(type: K, fn: RoomEvents[K]): void;

  /** Sets this session's state in the room (null clears it). Resolves once the node confirmed it, across reconnects. */
  setState(state: JSONValue | null): Promise<void>;
  /** Leaves the room; the view empties at once. */
  leave(): Promise<void>;
}

/**
 * The latest count of a count room. Frozen; the same object until the count
 * changes. The node reads it at a tick, so it may lead or trail a member
 * view's events by a tick; once the room is quiet it equals the room's total.
 */
export interface CountSnapshot {
  readonly count: number;
}

export interface CountChange {
  /** The frame's reason: "join" (the join's reply), "resync"; "update" when it has none. */
  readonly reason: string;
}

export interface CountRoomEvents {
  count: (count: number, change: CountChange) => void;
  status: (status: RoomStatus) => void;
  error: (err: PresenceError) => void;
}

/** A room joined with `view: "count"`: its member count, not its members. */
export interface CountRoom {
  readonly id: string;
  readonly view: "count";
  readonly present: boolean;
  readonly status: RoomStatus;
  /** The latest count (0 before the first). */
  readonly total: number;
  readonly error: PresenceError | undefined;
  readonly state: JSONValue | null;

  /** The latest count; undefined before the first count frame. */
  count(): number | undefined;
  /** For useSyncExternalStore: null before the first count and after the room ended. */
  getSnapshot(): CountSnapshot | null;
  subscribe(listener: () => void): () => void;

  on<K extends keyof CountRoomEvents>(type: K, fn: CountRoomEvents[K]): () => void;
  off<K extends keyof CountRoomEvents>(type: K, fn: CountRoomEvents[K]): void;

  /** As Room.setState; rejects with `not_joined` when joined with `present: false`. */
  setState(state: JSONValue | null): Promise<void>;
  leave(): Promise<void>;
}

/**
 * Status of a watch. `rewatching`: after a reconnect or an `unavailable`,
 * until the node answers the list sent again. `closed`, `failed` and
 * `revoked` (a refreshed token no longer grants the room) are final.
 */
export type WatchStatus = "pending" | "active" | "rewatching" | "closed" | "failed" | "revoked";

export interface WatchEvents {
  sync: (members: readonly Member[]) => void;
  join: (member: Member, change: MembershipChange) => void;
  leave: (member: Member, change: MembershipChange) => void;
  update: (member: Member, change: UpdateChange) => void;
  status: (status: WatchStatus) => void;
  /** A refused list (the old one stays), or why the watch failed. */
  error: (err: PresenceError) => void;
}

/** Some users of a room, followed without joining it. Members are kept as without detail. */
export interface Watch {
  readonly room: string;
  /** The list asked for last. */
  readonly users: readonly string[];
  readonly status: WatchStatus;
  readonly region: string | undefined;
  /** Number of watched users who are members. */
  readonly total: number;
  readonly error: PresenceError | undefined;
  /** Settles when the node answered the list asked for last (by client.watch or update). */
  readonly ready: Promise<void>;

  /** The watched users who are members, sorted by user. The same frozen array until it changes. */
  members(): readonly Member[];
  getSnapshot(): readonly Member[];
  subscribe(listener: () => void): () => void;

  on<K extends keyof WatchEvents>(type: K, fn: WatchEvents[K]): () => void;
  off<K extends keyof WatchEvents>(type: K, fn: WatchEvents[K]): void;

  /** Replaces the list. Rejects with `invalid_watch` (checked locally, or by the node), `forbidden`, `too_many_rooms`, `closed`, `revoked`. `unavailable` is retried. */
  update(users: readonly string[]): Promise<void>;
  /** Ends the watch; the view empties at once. */
  close(): Promise<void>;
}

export interface ClientEvents {
  status: (status: ClientStatus) => void;
  error: (err: PresenceError) => void;
}

export interface Client {
  readonly status: ClientStatus;
  /** The session id in use (may change once at start if the tab turns out to be a duplicate). */
  readonly sessionId: string;
  /** From `hello`. */
  readonly user: string | undefined;
  readonly region: string | undefined;
  readonly limits: Limits;
  readonly tokenExpires: Date | undefined;
  /**
   * The region's offline grace in ms, from `hello` (`offline_grace_ms`);
   * 12000 until a hello says otherwise. Reconnects are retried at most 1 s
   * apart until 1 s before it ends after a drop.
   */
  readonly offlineGraceMs: number;

  on<K extends keyof ClientEvents>(type: K, fn: ClientEvents[K]): () => void;
  off<K extends keyof ClientEvents>(type: K, fn: ClientEvents[K]): void;

  /**
   * The room, joined now if open and on every (re)connect. Same id, same
   * object (the first call's options win; asking for the other view throws
   * `invalid_view`).
   */
  room(id: string, options: CountRoomOptions): CountRoom;
  room(id: string, options?: RoomOptions): Room;
  rooms(): Array<Room | CountRoom>;
  /**
   * Follows `users` of a room, without joining it; sent again on every
   * reconnect. One watch per room: the same room gives the same object,
   * its list replaced. Throws `invalid_watch` for a bad list.
   */
  watch(roomId: string, users: readonly string[]): Watch;
  watches(): Watch[];
  /** Round trip in ms. Rejects with code "disconnected" when not open. */
  ping(): Promise<number>;
  /** Closes for good: status "closed", rooms "left", no reconnect. */
  close(): void;
}

export function createClient(options: ClientOptions): Client;

/** A new random session id: 22 characters of [A-Za-z0-9-_]. */
export function newSessionId(crypto?: { getRandomValues<T extends ArrayBufferView | null>(array: T): T }): string;
