package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/internal/testkit"
)

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns
// their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "presenced test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// A node given a certificate serves HTTPS and WSS only; a bad one stops
// it at start with a usage error (exit 2).
func TestE2ETLS(t *testing.T) {
	e := newEnv(t)
	certFile, keyFile, pool := selfSigned(t)
	tlsConf := &tls.Config{RootCAs: pool}
	p := e.start([]string{"node", "--region", "eu", "--redis", e.redis, "--nats", e.nats, "--listen", "127.0.0.1:0",
		"--jwt-secret", e2eSecret, "--tls-cert-file", certFile, "--tls-key-file", keyFile}, false)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf}, Timeout: 5 * time.Second}
	testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		if p.addr == "" {
			m := listening.FindStringSubmatch(p.out.String())
			if m == nil {
				return errors.New("no listening line in the node's log yet")
			}
			p.addr = m[1]
		}
		r, err := hc.Get("https://" + p.addr + "/healthz")
		if err != nil {
			return fmt.Errorf("health over HTTPS: %w", err)
		}
		r.Body.Close()
		return testkit.Want("the node's health over HTTPS", r.StatusCode, http.StatusOK)
	})
	if !strings.Contains(p.out.String(), "websocket=wss://") {
		t.Fatalf("the log does not announce wss://:\n%s", p.out.String())
	}
	if r, err := http.Get("http://" + p.addr + "/healthz"); err == nil {
		r.Body.Close()
		if r.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP was served")
		}
	}

	d := websocket.Dialer{TLSClientConfig: tlsConf, HandshakeTimeout: 5 * time.Second}
	ws, _, err := d.Dial("wss://"+p.addr+"/v1/ws?session=s&access_token="+token(t, "tess", "*"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, testkit.NewWS(t, ws, decodeMap), "tess", "s")
	if snap := c.join("lobby")["snapshot"].(map[string]any); snap["total"] != float64(1) {
		t.Fatalf("snapshot over WSS: %v", snap)
	}

	bad := e.start([]string{"node", "--redis", e.redis, "--nats", e.nats, "--jwt-secret", e2eSecret,
		"--tls-cert-file", keyFile, "--tls-key-file", keyFile}, false)
	if code := bad.exit(t, 10*time.Second); code != 2 || !strings.Contains(bad.out.String(), "--tls-cert-file") {
		t.Fatalf("bad certificate: exit %d\n%s", code, bad.out.String())
	}
}
