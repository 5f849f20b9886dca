# python3 -m unittest discover -s docs/webhooks
import unittest

from verify import verify_webhook

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
BODY = b'{"test": 2432232314}'
HEADERS = {
    "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
    "webhook-timestamp": "1614265330",
    "webhook-signature": "v1,Zm9vYmFy v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
}


class VerifyTest(unittest.TestCase):
    def test_signed_delivery_verifies(self):
        self.assertTrue(verify_webhook(SECRET, HEADERS, BODY, now=1614265330))

    def test_changed_body_old_timestamp_other_key(self):
        self.assertFalse(verify_webhook(SECRET, HEADERS, b'{"test": 1}', now=1614265330))
        self.assertFalse(verify_webhook(SECRET, HEADERS, BODY, now=1614265330 + 301))
        self.assertFalse(verify_webhook("whsec_" + "A" * 44, HEADERS, BODY, now=1614265330))


if __name__ == "__main__":
    unittest.main()
