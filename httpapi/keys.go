package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// Scope is what an API key may do: read queries only, or everything
// (admin: disconnects too).
type Scope string

// The scopes.
const (
	ScopeRead  Scope = "read"
	ScopeAdmin Scope = "admin"
)

// allows reports whether a key of scope s may call an endpoint that needs
// need.
func (s Scope) allows(need Scope) bool { return s == ScopeAdmin || s == need }

// MinSecretLen is the shortest key secret accepted: 24 bytes (say, 32
// random base64 characters, or `openssl rand -hex 24`).
const MinSecretLen = 24

// Key is one API key: a name (for logs and rate limits; never the
// secret), its scope and the SHA-256 of its secret.
type Key struct {
	Name  string
	Scope Scope
	sum   [sha256.Size]byte
}

// ParseKeys reads key entries, one per line or separated by commas:
// name:scope:secret, with scope read or admin and a secret of at least
// MinSecretLen bytes (it may hold ':', not ',' or whitespace). Blank
// lines and lines starting with # are skipped. Names and secrets must be
// unique.
func ParseKeys(text string) ([]Key, error) {
	var keys []Key
	names, sums := map[string]bool{}, map[[sha256.Size]byte]bool{}
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, entry := range strings.Split(line, ",") {
			k, err := parseKey(strings.TrimSpace(entry))
			if err != nil {
				return nil, fmt.Errorf("api keys: line %d: %w", n+1, err)
			}
			if names[k.Name] || sums[k.sum] {
				return nil, fmt.Errorf("api keys: line %d: key %q: its name or secret is used twice", n+1, k.Name)
			}
			names[k.Name], sums[k.sum] = true, true
			keys = append(keys, k)
		}
	}
	return keys, nil
}

func parseKey(entry string) (Key, error) {
	name, rest, ok1 := strings.Cut(entry, ":")
	scope, secret, ok2 := strings.Cut(rest, ":")
	if !ok1 || !ok2 {
		return Key{}, fmt.Errorf("entry %q: want name:scope:secret", cut(entry))
	}
	if name == "" || len(name) > 64 || strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "" {
		return Key{}, fmt.Errorf("key name %q: use 1 to 64 letters, digits, - and _", cut(name))
	}
	if s := Scope(scope); s != ScopeRead && s != ScopeAdmin {
		return Key{}, fmt.Errorf("key %q: scope %q: want read or admin", name, cut(scope))
	}
	if len(secret) < MinSecretLen || strings.ContainsAny(secret, " \t\r\n") {
		return Key{}, fmt.Errorf("key %q: the secret must be at least %d bytes, without whitespace", name, MinSecretLen)
	}
	return Key{Name: name, Scope: Scope(scope), sum: sha256.Sum256([]byte(secret))}, nil
}

// cut shortens what an error quotes: an entry may hold a secret.
func cut(s string) string {
	if len(s) > 12 {
		return s[:12] + "…"
	}
	return s
}

// Keys is the set of API keys in force: fixed ones and, when a file is
// given, the file's, read again when it changes. Safe for concurrent
// use.
type Keys struct {
	fixed []Key
	path  string
	last  atomic.Pointer[[sha256.Size]byte] // the file content's hash
	set   atomic.Pointer[[]Key]
	log   *slog.Logger
}

// NewKeys returns the keys of the entries in fixed (ParseKeys' format)
// and of the file at path (none if empty). A bad entry or an unreadable
// file is an error here; later, Watch keeps the keys it has when the file
// turns bad.
func NewKeys(fixed, path string, log *slog.Logger) (*Keys, error) {
	ks, err := ParseKeys(fixed)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	k := &Keys{fixed: ks, path: path, log: log}
	empty := []Key{}
	k.set.Store(&empty)
	if _, err := k.load(); err != nil {
		return nil, err
	}
	return k, nil
}

// Len is the number of keys in force; with none the API is off.
func (k *Keys) Len() int { return len(*k.set.Load()) }

// load reads the file (when set) and puts its keys with the fixed ones
// in force; changed is false when the file did not change.
func (k *Keys) load() (changed bool, err error) {
	all := append([]Key(nil), k.fixed...)
	if k.path != "" {
		b, err := os.ReadFile(k.path)
		if err != nil {
			return false, fmt.Errorf("api keys file: %w", err)
		}
		sum := sha256.Sum256(b)
		if last := k.last.Load(); last != nil && *last == sum {
			return false, nil
		}
		ks, err := ParseKeys(string(b))
		if err != nil {
			return false, fmt.Errorf("%s: %w", k.path, err)
		}
		for _, f := range ks {
			for _, x := range k.fixed {
				if x.Name == f.Name || x.sum == f.sum {
					return false, fmt.Errorf("%s: key %q: its name or secret is also given in --api-keys", k.path, f.Name)
				}
			}
		}
		all = append(all, ks...)
		k.last.Store(&sum)
	}
	k.set.Store(&all)
	return true, nil
}

// Watch reads the file again every interval until ctx is done, putting
// its keys in force when its content changed (a Kubernetes Secret's
// volume swaps the file; an editor rewrites it). A file that cannot be
// read or parsed is logged and the keys in force stay.
func (k *Keys) Watch(ctx context.Context, every time.Duration) {
	if k.path == "" || every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := k.load()
		switch {
		case err != nil:
			k.log.Error("presence: api keys file not reloaded; the keys in force stay", "err", err)
		case changed:
			k.log.Info("presence: api keys reloaded", "file", k.path, "keys", k.Len())
		}
	}
}

// lookup finds the key whose secret is token. Every key is compared, in
// constant time on the hashes, whatever matches: the time taken says
// nothing of how close a guess came.
func (k *Keys) lookup(token string) (Key, bool) {
	sum := sha256.Sum256([]byte(token))
	var found Key
	match := 0
	for _, key := range *k.set.Load() {
		if subtle.ConstantTimeCompare(key.sum[:], sum[:]) == 1 {
			found, match = key, 1
		}
	}
	return found, match == 1
}

// bearer returns the token of an "Authorization: Bearer <token>" header.
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}
