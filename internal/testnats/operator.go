package testnats

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// StartSecured runs a nats-server in operator (decentralized JWT) mode,
// as managed NATS services run: one account with JetStream, one user of
// it. It returns the server and the path of the user's .creds file;
// connections without valid credentials are refused.
func StartSecured(tb testing.TB) (*server.Server, string) {
	tb.Helper()
	must := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatalf("operator setup: %v", err)
		}
	}
	okp, err := nkeys.CreateOperator()
	must(err)
	opub, err := okp.PublicKey()
	must(err)
	oc := jwt.NewOperatorClaims(opub)
	ojwt, err := oc.Encode(okp)
	must(err)
	op, err := jwt.DecodeOperatorClaims(ojwt)
	must(err)

	account := func(js bool) (nkeys.KeyPair, string, string) {
		kp, err := nkeys.CreateAccount()
		must(err)
		pub, err := kp.PublicKey()
		must(err)
		ac := jwt.NewAccountClaims(pub)
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		tok, err := ac.Encode(okp)
		must(err)
		return kp, pub, tok
	}
	_, spub, sjwt := account(false)
	akp, apub, ajwt := account(true)

	ukp, err := nkeys.CreateUser()
	must(err)
	upub, err := ukp.PublicKey()
	must(err)
	ujwt, err := jwt.NewUserClaims(upub).Encode(akp)
	must(err)
	seed, err := ukp.Seed()
	must(err)
	creds, err := jwt.FormatUserConfig(ujwt, seed)
	must(err)
	path := filepath.Join(tb.TempDir(), "user.creds")
	must(os.WriteFile(path, creds, 0o600))

	resolver := &server.MemAccResolver{}
	must(resolver.Store(spub, sjwt))
	must(resolver.Store(apub, ajwt))
	o := Options(tb)
	o.TrustedOperators = []*jwt.OperatorClaims{op}
	o.AccountResolver = resolver
	o.SystemAccount = spub
	return StartWith(tb, o), path
}
