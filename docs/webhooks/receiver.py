"""A presence webhook receiver in Python, stdlib only: verifies each
delivery, dedupes by event id, folds each room's events in (epoch, seq)
order and takes a fresh snapshot from the HTTP API at a resync marker.
python3 docs/webhooks/receiver.py (env: WEBHOOK_SECRET, PRESENCE_API,
PRESENCE_KEY, PORT); GET /state shows the rooms' members as folded."""
import json
import os
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

from verify import verify_webhook

SECRET, API, KEY = os.environ["WEBHOOK_SECRET"], os.environ["PRESENCE_API"], os.environ["PRESENCE_KEY"]
seen = set()  # event and marker ids applied
rooms = {}  # room -> {"pos": (epoch, seq), "members": set}
counts = {"deliveries": 0, "duplicates": 0, "rejected": 0, "resyncs": 0}


def snapshot(room):
    members, offset, page = set(), 0, None
    while page is None or offset < page["total"]:
        q = urllib.parse.urlencode({"offset": offset, "limit": 100})
        req = urllib.request.Request(f"{API}/v1/rooms/{urllib.parse.quote(room, safe='')}/members?{q}",
                                     headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=10) as res:
            page = json.load(res)
        members.update(m["user"] for m in page["members"])
        if not page["members"]:
            break
        offset += len(page["members"])
    return {"pos": (page["epoch"], page["room_seq"]), "members": members}


def apply(e):
    if e["id"] in seen:
        counts["duplicates"] += 1
        return
    r = rooms.get(e["room"])
    if e["kind"] == "resync":
        counts["resyncs"] += 1
        rooms[e["room"]] = snapshot(e["room"])
    elif r is None or (e["epoch"], e["seq"]) > r["pos"]:
        r = r or {"members": set()}
        if e["kind"] == "online":
            r["members"].add(e["user"])
        elif e["kind"] == "offline":
            r["members"].discard(e["user"])
        r["pos"] = (e["epoch"], e["seq"])
        rooms[e["room"]] = r
    seen.add(e["id"])


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        state = {room: sorted(r["members"]) for room, r in rooms.items()}
        self.answer(200, json.dumps({"rooms": state, **counts}).encode())

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        headers = {k.lower(): v for k, v in self.headers.items()}
        if not verify_webhook(SECRET, headers, body):
            counts["rejected"] += 1
            return self.answer(400)
        try:
            for e in json.loads(body)["events"]:
                apply(e)
        except OSError as err:  # the snapshot failed: answer 503, the same ids come again
            return self.answer(503, str(err).encode())
        counts["deliveries"] += 1
        self.answer(204)

    def answer(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = HTTPServer(("127.0.0.1", int(os.environ.get("PORT", "0"))), Handler)
    print(f"listening {server.server_port}", flush=True)
    server.serve_forever()
