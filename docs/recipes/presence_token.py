"""A token for the presence node, minted for the user your app has
logged in. Python 3.8+, standard library only."""
import base64
import hashlib
import hmac
import json
import os
import time

SECRET = os.environ["PRESENCE_JWT_SECRET"].encode()  # the nodes' secret, at least 32 bytes


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def presence_token(user, rooms, ttl_seconds=3600, observe=False):
    """An HS256 JWT: sub, rooms (ids or prefixes ending in "*"), exp;
    observe lets the user follow rooms without being listed."""
    now = int(time.time())
    claims = {"sub": user, "rooms": rooms, "iat": now, "exp": now + ttl_seconds}
    if observe:
        claims["observe"] = True
    header = {"alg": "HS256", "typ": "JWT"}
    body = _b64url(json.dumps(header).encode()) + "." + _b64url(json.dumps(claims).encode())
    sig = hmac.new(SECRET, body.encode(), hashlib.sha256).digest()
    return body + "." + _b64url(sig)
