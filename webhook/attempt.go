package webhook

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"time"
)

// userAgent names the sender.
const userAgent = "presence-webhooks/1"

// result is what one delivery attempt came to.
type result struct {
	status     int           // the HTTP status; 0 if none came
	err        error         // why no status came
	retryAfter time.Duration // the receiver's Retry-After, if any
	took       time.Duration
}

func (r result) ok() bool   { return r.err == nil && r.status >= 200 && r.status < 300 }
func (r result) gone() bool { return r.err == nil && r.status == http.StatusGone }

// class names the outcome for metrics: the status, or the failure.
func (r result) class() string { return failureClass(r.status, r.err) }

// post makes one signed attempt within the endpoint's timeout. The
// timestamp is the attempt's; id and body are the same on every retry.
func post(ctx context.Context, c *http.Client, e *Endpoint, id string, body []byte, now time.Time) result {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, time.Duration(e.Timeout))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL, bytes.NewReader(body))
	if err != nil {
		return result{err: err}
	}
	ts := now.Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set(HeaderID, id)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderSignature, SignatureHeader(e.secrets, id, ts, body))
	resp, err := c.Do(req)
	if err != nil {
		return result{err: err, took: time.Since(start)}
	}
	// A small answer is read to its end, so the connection is reused; a
	// larger or endless one is cut at the limit (closing the connection).
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, responseLimit))
	_ = resp.Body.Close()
	return result{status: resp.StatusCode, retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), now), took: time.Since(start)}
}

// parseRetryAfter reads seconds or an HTTP date; zero when absent or bad.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
