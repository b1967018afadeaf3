// Package sidecar starts a real `turnwire serve` process on a free port of
// 127.0.0.1 for tests (and, later, the Go conformance runner): a throwaway
// SQLite store and, optionally, a config file, in a temporary directory.
package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// EnvBinary names the environment variable holding the server command
// (tools/go-test.sh sets it to the repository's .venv/bin/turnwire);
// "turnwire" from PATH when unset.
const EnvBinary = "TURNWIRE_BIN"

const (
	// A deadline, not a speed target: a loaded 2-core CI has taken about 60 s to start a process
	// that imports grpc, the SDKs and pydantic while `make test` runs pytest's workers beside it.
	startTimeout = 120 * time.Second
	stopTimeout  = 15 * time.Second
	portAttempts = 3
)

// Sidecar is a running `turnwire serve`.
type Sidecar struct {
	// Addr is "127.0.0.1:PORT".
	Addr string

	dir    string
	cmd    *exec.Cmd
	log    *LockedBuffer
	exited chan struct{} // closed when the process ended
}

// Start runs `turnwire serve` in a new temporary directory with config (any
// JSON-encodable value; JSON is YAML) as its --config, nil for the embedded
// defaults (the scripted:demo model, the demo tools), and waits until its
// grpc.health.v1 Check answers SERVING. Inherited TURNWIRE_* variables are
// dropped so the caller's environment cannot change the setup. Stop it with
// Stop.
func Start(config any) (*Sidecar, error) {
	return StartWith(config, grpc.WithInsecure())
}

// StartWith is Start for a sidecar reached with security (a
// grpc.WithTransportCredentials for a config with tls:), which the readiness
// check dials with.
func StartWith(config any, security grpc.DialOption) (*Sidecar, error) {
	dir, err := os.MkdirTemp("", "turnwire-go-")
	if err != nil {
		return nil, err
	}
	var configPath string
	if config != nil {
		text, err := json.Marshal(config)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		configPath = filepath.Join(dir, "turnwire.yaml")
		if err := os.WriteFile(configPath, text, 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	for attempt := 1; ; attempt++ {
		s, err := spawn(dir, configPath)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		err = s.waitServing(security)
		if err == nil {
			return s, nil
		}
		s.kill()
		// Another process may have taken the port between probe and listen.
		if attempt < portAttempts && strings.Contains(s.Log(), "cannot listen on") {
			continue
		}
		os.RemoveAll(dir)
		return nil, err
	}
}

func spawn(dir, configPath string) (*Sidecar, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	binary := os.Getenv(EnvBinary)
	if binary == "" {
		binary = "turnwire"
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	args := []string{"serve", "--listen", addr, "--store", "sqlite:///" + filepath.Join(dir, "turnwire.db")}
	if configPath != "" {
		args = append(args, "--config", configPath)
	}
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TURNWIRE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	log := &LockedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (set %s to the turnwire command): %w", binary, EnvBinary, err)
	}
	s := &Sidecar{Addr: addr, dir: dir, cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	return s, nil
}

// waitServing returns nil once Check answers SERVING; an error when the
// process exits first or startTimeout passes.
func (s *Sidecar) waitServing(security grpc.DialOption) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	go func() {
		select {
		case <-s.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	// Reconnect quickly while the process starts (gRPC's default backoff
	// begins at one second).
	conn, err := grpc.DialContext(ctx, s.Addr, security,
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second,
		}}))
	if err != nil {
		return err
	}
	defer conn.Close()
	health := grpc_health_v1.NewHealthClient(conn)
	for {
		// WaitForReady: the call waits for the connection instead of failing
		// while the server is not listening yet; Watch answers the current
		// status, then every change.
		watch, err := health.Watch(ctx, &grpc_health_v1.HealthCheckRequest{}, grpc.WaitForReady(true))
		for err == nil {
			var update *grpc_health_v1.HealthCheckResponse
			if update, err = watch.Recv(); err == nil && update.GetStatus() == grpc_health_v1.HealthCheckResponse_SERVING {
				// SERVING from this process (its own announcement), not from another
				// test's sidecar that took the same port first (this one then exits:
				// cannot listen).
				if s.announced() {
					return nil
				}
				err = fmt.Errorf("another process answers on %s", s.Addr)
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("turnwire exited while starting (%s):\n%s", s.cmd.ProcessState, s.Log())
		case <-ctx.Done():
			return fmt.Errorf("turnwire at %s not SERVING after %s (%v):\n%s", s.Addr, startTimeout, err, s.Log())
		default:
		}
		if status.Code(err) == codes.Unimplemented {
			return fmt.Errorf("turnwire at %s: %v", s.Addr, err)
		}
		// Otherwise the connection broke while the server started: watch again.
	}
}

// announced reports whether the process logged that it listens on s.Addr,
// waiting up to a second for the line (it follows SERVING).
func (s *Sidecar) announced() bool {
	line := "turnwire listening on " + s.Addr
	for deadline := time.Now().Add(time.Second); ; {
		if strings.Contains(s.Log(), line) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond) // polling the log for the line
	}
}

// Log is what the process wrote to stdout and stderr so far.
func (s *Sidecar) Log() string {
	return s.log.String()
}

// Stop sends SIGTERM, waits for the exit and removes the directory; an error
// when the process did not exit with code 0 within stopTimeout (it is then
// killed).
func (s *Sidecar) Stop() error {
	defer os.RemoveAll(s.dir)
	select {
	case <-s.exited:
		return fmt.Errorf("turnwire had exited (%s):\n%s", s.cmd.ProcessState, s.Log())
	default:
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		s.kill()
		return fmt.Errorf("turnwire did not exit within %s of SIGTERM:\n%s", stopTimeout, s.Log())
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("turnwire exited with code %d after SIGTERM:\n%s", code, s.Log())
	}
	return nil
}

func (s *Sidecar) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// freePort is a port of 127.0.0.1 nothing listened on a moment ago.
func freePort() (int, error) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer listener.Close()
	return listener.Addr().(*net.TCPAddr).Port, nil
}

// LockedBuffer is a log a test reads while another goroutine writes it (the
// process log, written by exec's copying goroutine; the kit's log).
type LockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
