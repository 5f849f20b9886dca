package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks headers.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts a secret as Standard Webhooks writes it:
// whsec_<base64 of the key bytes>.
const SecretPrefix = "whsec_"

// minSecretBytes is the shortest key taken (Standard Webhooks: at least
// 24 bytes; 64 at most).
const (
	minSecretBytes = 24
	maxSecretBytes = 64
)

// Secret is one HMAC-SHA256 signing key.
type Secret struct{ key []byte }

// ParseSecret reads whsec_<base64>. The key must be 24 to 64 bytes.
func ParseSecret(s string) (Secret, error) {
	b64, ok := strings.CutPrefix(s, SecretPrefix)
	if !ok {
		return Secret{}, errors.New("a secret starts with whsec_")
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return Secret{}, fmt.Errorf("secret: not base64 after whsec_: %w", err)
	}
	if len(key) < minSecretBytes || len(key) > maxSecretBytes {
		return Secret{}, fmt.Errorf("secret: %d key bytes, want %d to %d", len(key), minSecretBytes, maxSecretBytes)
	}
	return Secret{key: key}, nil
}

// Sign returns v1,<base64 HMAC-SHA256 of id.timestamp.body>.
func (s Secret) Sign(id string, ts int64, body []byte) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write(strconv.AppendInt(nil, ts, 10))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// SignatureHeader is the webhook-signature value: one signature per
// secret, space-separated, so a receiver verifies with either key while
// a secret rotates.
func SignatureHeader(secrets []Secret, id string, ts int64, body []byte) string {
	sigs := make([]string, len(secrets))
	for i, s := range secrets {
		sigs[i] = s.Sign(id, ts, body)
	}
	return strings.Join(sigs, " ")
}

// Verify checks a delivery as a receiver does: the timestamp within
// tolerance of now, and one signature of the header made with secret.
// The receiver recipes in docs/WEBHOOKS.md do the same in Node, Python
// and Go.
func Verify(secret Secret, id, timestamp, signatures string, body []byte, now time.Time, tolerance time.Duration) error {
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return errors.New("webhook-timestamp is not an integer")
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return errors.New("webhook-timestamp is outside the tolerance")
	}
	want := []byte(secret.Sign(id, ts, body))
	for _, sig := range strings.Fields(signatures) {
		if hmac.Equal([]byte(sig), want) {
			return nil
		}
	}
	return errors.New("no signature matches")
}
