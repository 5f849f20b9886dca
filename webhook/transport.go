package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// Transport bounds. A receiver answers with a status; its body is read
// up to responseLimit (to reuse the connection when it is small) and
// never more.
const (
	responseLimit    = 4 << 10
	connectTimeout   = 5 * time.Second
	handshakeTimeout = 5 * time.Second
	idleConnTimeout  = 90 * time.Second
)

// ErrForbiddenAddress is a dial to an address no endpoint may reach
// (loopback, private, link-local, ...) unless its allow_networks holds it.
var ErrForbiddenAddress = errors.New("address not allowed for webhooks")

// blocked are the ranges refused by default, besides what netip calls
// loopback, private, link-local, multicast and unspecified: shared
// address space, benchmarking, reserved, NAT64 (which reaches IPv4
// behind it), documentation.
var blocked = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("2001:db8::/32"),
}

// addressAllowed reports whether a webhook may connect to ip: a public
// unicast address, or one inside allowed.
func addressAllowed(ip netip.Addr, allowed []netip.Prefix) bool {
	ip = ip.Unmap()
	for _, p := range allowed {
		if p.Contains(ip) {
			return true
		}
	}
	if ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsInterfaceLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() || !ip.IsValid() {
		return false
	}
	for _, p := range blocked {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}

// newClient returns the HTTP client of one endpoint. The address check
// runs at dial time on the address being connected to, after DNS, so a
// name that resolves (or is made to resolve: DNS rebinding) to a
// forbidden address is refused. No proxy (it would dial for us), no
// redirects, TLS verified against the system roots or caFile.
func newClient(e *Endpoint) *http.Client {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: e.roots}
	allowed := e.allowed
	d := &net.Dialer{
		Timeout: min(connectTimeout, time.Duration(e.Timeout)),
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: %s", ErrForbiddenAddress, address)
			}
			if !addressAllowed(ap.Addr(), allowed) {
				return fmt.Errorf("%w: %s (add it to allow_networks to permit it)", ErrForbiddenAddress, ap.Addr())
			}
			return nil
		},
	}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		TLSClientConfig:       tc,
		TLSHandshakeTimeout:   handshakeTimeout,
		ResponseHeaderTimeout: time.Duration(e.Timeout),
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       idleConnTimeout,
		ForceAttemptHTTP2:     true,
	}
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// failureClass names a failed attempt for metrics and logs: the HTTP
// status, or what went wrong before one came.
func failureClass(status int, err error) string {
	var cve *tls.CertificateVerificationError
	var rhe tls.RecordHeaderError
	var ne net.Error
	switch {
	case err == nil:
		return fmt.Sprint(status)
	case errors.Is(err, ErrForbiddenAddress):
		return "forbidden_address"
	case errors.As(err, &cve), errors.As(err, &rhe):
		return "tls"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "network"
}
