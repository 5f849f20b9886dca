package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// recipe: go
// verifyWebhook checks a presence webhook (Standard Webhooks) in Go,
// standard library only: the timestamp within 5 minutes of now, and one
// of the signatures made with secret over id.timestamp.body.
func verifyWebhook(secret string, h http.Header, body []byte, now time.Time) bool {
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if id == "" || err != nil || now.Sub(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return false
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return false
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	want := []byte("v1," + base64.StdEncoding.EncodeToString(m.Sum(nil)))
	for _, sig := range strings.Fields(h.Get("webhook-signature")) {
		if hmac.Equal([]byte(sig), want) {
			return true
		}
	}
	return false
}

// end recipe

// A receiver verifies a delivery before it reads the body; the vector is
// the one the Node and Python recipes check.
func Example_verifyWebhook() {
	h := http.Header{}
	h.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1,Zm9vYmFy v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	body := []byte(`{"test": 2432232314}`)
	secret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	fmt.Println(verifyWebhook(secret, h, body, time.Unix(1614265330, 0)))
	fmt.Println(verifyWebhook(secret, h, []byte(`{"test": 1}`), time.Unix(1614265330, 0)))
	fmt.Println(verifyWebhook(secret, h, body, time.Unix(1614265330+301, 0)))
	// Output:
	// true
	// false
	// false
}
