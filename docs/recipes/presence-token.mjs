// GET /presence-token: a token for the presence node, minted for the user
// your app has logged in. Node 18+, no packages. Works as a plain
// node:http handler and as an Express route.
import { createHmac } from "node:crypto";

const secret = process.env.PRESENCE_JWT_SECRET; // the nodes' secret, at least 32 bytes

const b64url = (v) => Buffer.from(JSON.stringify(v)).toString("base64url");

// presenceToken signs an HS256 JWT: sub, rooms (ids or prefixes ending in
// "*"), exp; observe lets the user follow rooms without being listed.
export function presenceToken(user, rooms, { ttlSeconds = 3600, observe = false } = {}) {
  const now = Math.floor(Date.now() / 1000);
  const claims = { sub: user, rooms, iat: now, exp: now + ttlSeconds };
  if (observe) claims.observe = true;
  const body = b64url({ alg: "HS256", typ: "JWT" }) + "." + b64url(claims);
  return body + "." + createHmac("sha256", secret).update(body).digest("base64url");
}

// presenceTokenHandler answers the logged-in user's token, or 401.
// currentUser(req) is your session lookup: {id, team} or null.
export function presenceTokenHandler(currentUser) {
  return (req, res) => {
    const user = currentUser(req);
    if (!user) {
      res.writeHead(401).end();
      return;
    }
    const token = presenceToken(user.id, [`team${user.team}-*`, "lobby"]);
    res.writeHead(200, { "Content-Type": "text/plain", "Cache-Control": "no-store" }).end(token);
  };
}
