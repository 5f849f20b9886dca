"""Verify a presence webhook (Standard Webhooks) in Python, stdlib only."""
import base64
import hashlib
import hmac
import time


def verify_webhook(secret, headers, raw_body, now=None):
    msg_id = headers.get("webhook-id", "")
    ts = headers.get("webhook-timestamp", "")
    if not msg_id or not ts.isdigit():
        return False
    if abs((time.time() if now is None else now) - int(ts)) > 300:
        return False
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + raw_body, hashlib.sha256)
    want = "v1," + base64.b64encode(mac.digest()).decode()
    return any(hmac.compare_digest(s, want) for s in headers.get("webhook-signature", "").split())
