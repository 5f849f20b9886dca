package node

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/lestrrat-go/httprc/v3"
	"github.com/lestrrat-go/httprc/v3/errsink"
	"github.com/lestrrat-go/jwx/v3/jwk"
)

// JWKS defaults and bounds.
const (
	// DefaultJWKSRefresh is how often a node fetches its JWKS again.
	DefaultJWKSRefresh = 5 * time.Minute
	// jwksRefetchEvery is the least time between two fetches for tokens
	// whose kid the set lacks: a key published by a rotation is picked up
	// at once, and a flood of made-up kids costs the provider one fetch
	// per interval (JWKSRefresh when shorter).
	jwksRefetchEvery = 10 * time.Second
	// jwksFetchTimeout bounds one fetch, and with it a handshake waiting
	// for one.
	jwksFetchTimeout = 5 * time.Second
	// Bounds on what a JWKS may be: providers publish a handful of keys.
	jwksMaxBytes = 1 << 20
	jwksMaxKeys  = 100
)

// jwks is a JSON Web Key Set fetched from a URL (an identity provider's
// jwks_uri) and kept fresh: fetched again every refresh, and at once,
// rate-limited, when a token names a kid it lacks. A failed fetch keeps
// the keys of the last good one. The fetching and caching is jwx's
// jwk.Cache.
type jwks struct {
	url    string
	cache  *jwk.Cache
	res    *httprc.ResourceBase[jwk.Set]
	ctx    context.Context // the cache's; cancelled by close
	cancel context.CancelFunc
	log    *slog.Logger
	every  time.Duration // least time between refetches

	mu   sync.Mutex // one refetch at a time; the others wait for it
	last time.Time  // last refetch for an unknown kid
	now  func() time.Time
}

// checkJWKS checks a JWKS URL and refresh interval (0: the default).
func checkJWKS(u string, refresh time.Duration) error {
	if p, err := url.Parse(u); err != nil || (p.Scheme != "https" && p.Scheme != "http") || p.Host == "" {
		return configError("auth: jwks url", fmt.Sprintf("want an http:// or https:// URL, got %q", u))
	}
	if refresh != 0 && refresh < time.Second {
		return configError("auth: jwks refresh", fmt.Sprintf("must be at least 1s, got %v", refresh))
	}
	return nil
}

// newJWKS registers u (checked by checkJWKS) with a jwk.Cache and starts
// fetching it in the background: a provider that is down does not stop
// the node from starting, and tokens signed by its keys are refused
// until it answers.
func newJWKS(u string, refresh time.Duration, log *slog.Logger) (*jwks, error) {
	refresh = cmp.Or(refresh, DefaultJWKSRefresh)
	j := &jwks{url: u, log: log, every: min(jwksRefetchEvery, refresh), now: time.Now}
	j.ctx, j.cancel = context.WithCancel(context.Background())
	sink := errsink.NewFunc(func(_ context.Context, err error) {
		log.Warn("node: auth: JWKS fetch failed; the keys of the last good fetch stay in use", "url", u, "err", err)
	})
	cache, err := jwk.NewCache(j.ctx, httprc.NewClient(httprc.WithErrorSink(sink), httprc.WithWorkers(1)))
	if err == nil {
		err = cache.Register(j.ctx, u, jwk.WithWaitReady(false),
			jwk.WithConstantInterval(refresh), jwk.WithMinInterval(refresh),
			jwk.WithHTTPClient(jwk.WrapHTTPClientDefaults(&http.Client{Timeout: jwksFetchTimeout})),
			jwk.WithMaxFetchBodySize(jwksMaxBytes), jwk.WithMaxKeys(jwksMaxKeys))
	}
	if err == nil {
		j.res, err = cache.LookupResource(j.ctx, u)
	}
	if err != nil {
		j.cancel()
		return nil, configError("auth: jwks url", err.Error())
	}
	j.cache = cache
	log.Info("node: auth: verifying RS256, ES256 and EdDSA tokens with the JWKS", "url", u, "refresh", refresh)
	return j, nil
}

// close stops the cache's goroutines.
func (j *jwks) close() {
	j.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = j.cache.Shutdown(ctx)
}

// lookup finds kid in the set; a nil set (not fetched yet) has nothing.
func lookup(set jwk.Set, kid string) (jwk.Key, bool) {
	if set == nil {
		return nil, false
	}
	return set.LookupKeyID(kid)
}

// key returns the public key of kid for a token signed with alg,
// fetching the set again (rate-limited) when it lacks kid.
func (j *jwks) key(kid, alg string) (any, error) {
	k, ok := lookup(j.res.Resource(), kid)
	if !ok {
		k, ok = lookup(j.refetch(), kid)
	}
	if !ok {
		if j.res.Resource() == nil {
			return nil, &authError{"no signing keys yet: the JWKS has not been fetched (the node retries)"}
		}
		return nil, &authError{fmt.Sprintf("token kid %q is not in the JWKS", kid)}
	}
	return jwkPublicKey(k, kid, alg)
}

// refetch fetches the set again unless one was fetched for an unknown
// kid within the last interval, and returns the set then in use.
// Callers arriving during a fetch wait for it and get its keys.
func (j *jwks) refetch() jwk.Set {
	j.mu.Lock()
	defer j.mu.Unlock()
	if now := j.now(); now.Sub(j.last) >= j.every {
		j.last = now
		ctx, cancel := context.WithTimeout(j.ctx, jwksFetchTimeout)
		defer cancel()
		if _, err := j.cache.Refresh(ctx, j.url); err != nil {
			j.log.Warn("node: auth: JWKS fetch for an unknown kid failed", "url", j.url, "err", err)
		}
	}
	return j.res.Resource()
}

// jwkPublicKey checks that a JWKS key may verify a token signed with alg
// (for signatures, of that algorithm if it names one, of the key type
// alg needs) and returns it as the crypto type golang-jwt verifies with.
func jwkPublicKey(k jwk.Key, kid, alg string) (any, error) {
	if use, ok := k.KeyUsage(); ok && use != "sig" {
		return nil, &authError{fmt.Sprintf("JWKS key %q is for %q, not signatures", kid, use)}
	}
	if ka, ok := k.Algorithm(); ok && ka.String() != alg {
		return nil, &authError{fmt.Sprintf("JWKS key %q is for %s, the token is signed with %s", kid, ka, alg)}
	}
	raw, err := jwk.PublicRawKeyOf(k)
	if err != nil {
		return nil, &authError{fmt.Sprintf("JWKS key %q: %v", kid, err)}
	}
	got, err := algorithmOf(raw)
	if err != nil {
		return nil, &authError{fmt.Sprintf("JWKS key %q: %v", kid, err)}
	}
	if got != alg {
		return nil, &authError{fmt.Sprintf("JWKS key %q verifies %s, the token is signed with %s", kid, got, alg)}
	}
	return raw, nil
}
