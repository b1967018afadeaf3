package turnwire

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

// TLSMismatch is what a sidecar wants that a connection did not give.
type TLSMismatch int

const (
	// WantsTLS: a plaintext connection to a sidecar that serves TLS.
	WantsTLS TLSMismatch = iota + 1
	// WantsClientCertificate: a TLS connection without a certificate the
	// sidecar accepts, to a sidecar that requires one (mutual TLS).
	WantsClientCertificate
	// ServesPlaintext: a TLS connection to a plaintext sidecar.
	ServesPlaintext
)

// TLSMismatchError is a Dial that failed because the connection's TLS does
// not match the sidecar's (gRPC says only "context deadline exceeded" or a
// TLS error). Its message says what the sidecar wants and which dial option
// gives it, in the sentences of the Python and TypeScript clients; Err is
// gRPC's own error (errors.Is(err, context.DeadlineExceeded) still holds).
type TLSMismatchError struct {
	Mismatch TLSMismatch
	Addr     string
	Err      error
}

func (e *TLSMismatchError) Error() string {
	where := "the sidecar at " + e.Addr
	var text string
	switch e.Mismatch {
	case WantsTLS:
		text = where + " wants TLS, and this client connected in plaintext: dial with " +
			"grpc.WithTransportCredentials(credentials.NewTLS(cfg)) instead of grpc.WithInsecure()"
	case WantsClientCertificate:
		text = where + " wants a client certificate (mutual TLS), and this client presented none it " +
			"accepts: set cfg.Certificates in credentials.NewTLS(cfg)"
	default:
		text = where + " does not speak TLS (it serves plaintext): dial with grpc.WithInsecure()"
	}
	return text + " (" + e.Err.Error() + ")"
}

// Unwrap is gRPC's error.
func (e *TLSMismatchError) Unwrap() error { return e.Err }

// spoken records whether the connections Dial makes start with a TLS
// handshake or in plaintext (the first byte a client writes: 0x16, a TLS
// handshake record, or the HTTP/2 preface), so a failed Dial can be explained.
type spoken struct{ security int32 }

const (
	spokeNothing int32 = iota
	spokePlaintext
	spokeTLS
)

// dial is a grpc.WithContextDialer dialer that records what the client spoke.
func (s *spoken) dial(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &recordingConn{Conn: conn, spoken: s}, nil
}

type recordingConn struct {
	net.Conn
	spoken *spoken
	once   sync.Once
}

func (c *recordingConn) Write(b []byte) (int, error) {
	if len(b) > 0 {
		c.once.Do(func() {
			security := spokePlaintext
			if b[0] == 0x16 {
				security = spokeTLS
			}
			atomic.StoreInt32(&c.spoken.security, security)
		})
	}
	return c.Conn.Write(b)
}

// recordingDialer is the dial option recording what the client speaks to
// addr, for a host:port address (nil for other targets: unix sockets, URIs).
func recordingDialer(addr string, s *spoken) grpc.DialOption {
	if strings.Contains(addr, "://") || strings.HasPrefix(addr, "unix:") {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil
	}
	return grpc.WithContextDialer(s.dial)
}

// explainDial is err, or a *TLSMismatchError when the client spoke one way
// to a sidecar at addr that speaks the other (or wants a certificate): one
// TLS handshake of its own tells (at most about probeTimeout).
func explainDial(addr string, s *spoken, err error) error {
	security := atomic.LoadInt32(&s.security)
	if security == spokeNothing {
		return err
	}
	if security == spokeTLS && strings.Contains(err.Error(), "first record does not look like a TLS handshake") {
		return &TLSMismatchError{ServesPlaintext, addr, err}
	}
	switch outcome := probeTLS(addr, probeTimeout); {
	case security == spokePlaintext && (outcome == probeAccepted || outcome == probeCertificateRequired):
		return &TLSMismatchError{WantsTLS, addr, err}
	case security == spokeTLS && outcome == probeCertificateRequired:
		return &TLSMismatchError{WantsClientCertificate, addr, err}
	case security == spokeTLS && outcome == probeNoTLS:
		return &TLSMismatchError{ServesPlaintext, addr, err}
	}
	return err
}

const probeTimeout = 3 * time.Second

type probeOutcome int

const (
	probeUnknown probeOutcome = iota
	probeNoTLS
	probeCertificateRequired
	probeAccepted
)

// h2Preface is the HTTP/2 connection preface and an empty SETTINGS frame
// (RFC 9113 §3.4): a gRPC server answers with its own SETTINGS.
var h2Preface = append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)

// probeTLS makes one TLS handshake with addr (the certificate not checked:
// it only asks what the server speaks), then sends the HTTP/2 preface.
func probeTLS(addr string, timeout time.Duration) probeOutcome {
	raw, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return probeUnknown
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(timeout))
	host, _, _ := net.SplitHostPort(addr)
	conn := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}, ServerName: host})
	if err := conn.Handshake(); err != nil {
		switch {
		case certificateAlert(err):
			return probeCertificateRequired
		case isTimeout(err):
			return probeUnknown
		}
		return probeNoTLS
	}
	if _, err := conn.Write(h2Preface); err != nil {
		if certificateAlert(err) {
			return probeCertificateRequired
		}
		return probeUnknown
	}
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		if certificateAlert(err) || errors.Is(err, io.EOF) {
			return probeCertificateRequired // refused, or dropped, right after the handshake
		}
		return probeUnknown
	}
	return probeAccepted
}

// certificateAlert: the TLS alerts of a server requiring a client
// certificate (TLS 1.3's certificate_required; TLS 1.2's).
func certificateAlert(err error) bool {
	text := err.Error()
	return strings.Contains(text, "certificate required") || strings.Contains(text, "bad certificate") ||
		strings.Contains(text, "handshake failure")
}

func isTimeout(err error) bool {
	var timeout net.Error
	return errors.As(err, &timeout) && timeout.Timeout()
}
