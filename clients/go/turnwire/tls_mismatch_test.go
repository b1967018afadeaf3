package turnwire_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"turnwire.dev/go/internal/sidecar"
	"turnwire.dev/go/turnwire"
)

// Issue 32 item 17, the Go side: a Dial whose TLS does not match the
// sidecar's said "context deadline exceeded" or a raw TLS error; it now
// returns a *TLSMismatchError saying what the sidecar wants, as the Python
// and TypeScript clients do. One mutual-TLS sidecar serves two cases (a
// plaintext client: it wants TLS; a TLS client without a certificate: it
// wants one); the shared plaintext sidecar the third.
func TestADialWhoseTLSDoesNotMatchSaysWhatTheSidecarWants(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCertificate(t, nil, nil, func(c *x509.Certificate) {
		c.IsCA, c.BasicConstraintsValid, c.KeyUsage = true, true, x509.KeyUsageCertSign
	})
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	serverCert, serverKey := newCertificate(t, ca, caKey, func(c *x509.Certificate) {
		c.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	})
	writePEM(t, filepath.Join(dir, "server.pem"), "CERTIFICATE", serverCert.Raw)
	writePEM(t, filepath.Join(dir, "server.key"), "PRIVATE KEY", pkcs8(t, serverKey))
	clientCert, clientKey := newCertificate(t, ca, caKey, func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	withCertificate := credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{
		{Certificate: [][]byte{clientCert.Raw}, PrivateKey: clientKey},
	}})
	mtls, err := sidecar.StartWith(map[string]any{"tls": map[string]any{
		"cert_file":      filepath.Join(dir, "server.pem"),
		"key_file":       filepath.Join(dir, "server.key"),
		"client_ca_file": filepath.Join(dir, "ca.pem"),
		"client_auth":    "require",
	}}, grpc.WithTransportCredentials(withCertificate))
	if err != nil {
		t.Fatal(err)
	}
	defer mtls.Stop()
	withoutCertificate := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots}))
	cases := []struct {
		addr     string
		security grpc.DialOption
		want     turnwire.TLSMismatch
		words    string
	}{
		{mtls.Addr, grpc.WithInsecure(), turnwire.WantsTLS, "wants TLS, and this client connected in plaintext"},
		{mtls.Addr, withoutCertificate, turnwire.WantsClientCertificate, "wants a client certificate (mutual TLS)"},
		{server.Addr, withoutCertificate, turnwire.ServesPlaintext, "does not speak TLS (it serves plaintext)"},
	}
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := turnwire.Dial(ctx, c.addr, c.security)
		cancel()
		var mismatch *turnwire.TLSMismatchError
		if !errors.As(err, &mismatch) || mismatch.Mismatch != c.want || !strings.Contains(err.Error(), c.words) ||
			!strings.HasPrefix(err.Error(), "the sidecar at "+c.addr+" ") {
			t.Errorf("Dial(%s) = %v; want a TLSMismatchError saying %q", c.addr, err, c.words)
		}
	}
}

// newCertificate is a new ECDSA key and a certificate for it, signed by
// parent (self-signed when nil), shaped by edit.
func newCertificate(t *testing.T, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, edit func(*x509.Certificate)) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "turnwire test " + serial.String()},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	edit(template)
	if parent == nil {
		parent, parentKey = template, key
	}
	der, err := x509.CreateCertificate(rand.Reader, template, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	certificate, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return certificate, key
}

func pkcs8(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
