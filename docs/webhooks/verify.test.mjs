// node --test docs/webhooks/
import { test } from "node:test";
import assert from "node:assert/strict";
import { verifyWebhook } from "./verify.mjs";

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const body = Buffer.from('{"test": 2432232314}');
const headers = {
  "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
  "webhook-timestamp": "1614265330",
  // A secret rotating: the old key's signature first, then this one's.
  "webhook-signature": "v1,Zm9vYmFy v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
};

test("a signed delivery verifies", () => {
  assert.equal(verifyWebhook(secret, headers, body, 1614265330), true);
});

test("a changed body, an old timestamp or another key does not", () => {
  assert.equal(verifyWebhook(secret, headers, Buffer.from('{"test": 1}'), 1614265330), false);
  assert.equal(verifyWebhook(secret, headers, body, 1614265330 + 301), false);
  assert.equal(verifyWebhook("whsec_" + Buffer.alloc(32).toString("base64"), headers, body, 1614265330), false);
});
