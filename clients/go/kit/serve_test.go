package kit_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/kit"
)

// Serve on a unix socket answers until its context ends, then returns nil.
func TestServeUntilTheContextEnds(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "kit.sock")
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- kit.Serve(ctx, "unix:"+socket, nil, add) }()

	conn := dialSocket(t, socket)
	listed, err := turnwirev1.NewToolExecutorServiceClient(conn).ListTools(testContext(t), &turnwirev1.ListToolsRequest{}, grpc.WaitForReady(true))
	if err != nil || len(listed.GetTools()) != 1 {
		t.Fatalf("ListTools: %v, %v", listed, err)
	}
	cancel()
	if err := wait(t, served, "Serve's return"); err != nil {
		t.Fatalf("Serve returned %v; want nil after its context ended", err)
	}
}

// dialSocket connects to the kit served on the unix socket, retrying soon (not
// after gRPC's 1 s) while Serve may not listen yet; closed when the test ends.
func dialSocket(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	retry := grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1, MaxDelay: 20 * time.Millisecond}}
	conn, err := grpc.DialContext(testContext(t), "unix:"+socket, grpc.WithInsecure(), grpc.WithConnectParams(retry))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestServeReportsWhatCannotServe(t *testing.T) {
	if err := kit.Serve(testContext(t), "127.0.0.1:0", nil); err == nil || !strings.Contains(err.Error(), "no hooks and no tools") {
		t.Errorf("Serve of nothing: %v", err)
	}
	if err := kit.Serve(testContext(t), "unix:"+filepath.Join(t.TempDir(), "missing", "kit.sock"), nil, add); err == nil {
		t.Errorf("Serve on a socket in a missing folder: nil; want the listener's error")
	}
}

// A server killed on a unix socket leaves its file behind: Serve there again
// serves (the file is stale), while a socket a live server listens on is not
// taken from it. Before the fresh-user trial a restart after a crash failed
// with "bind: address already in use".
func TestServeOnTheSocketACrashedServerLeft(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "kit.sock")
	crashed, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	crashed.(*net.UnixListener).SetUnlinkOnClose(false) // as SIGKILL leaves it
	crashed.Close()

	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- kit.Serve(ctx, "unix:"+socket, nil, add) }()
	conn := dialSocket(t, socket)
	listCtx, listed := context.WithTimeout(testContext(t), 10*time.Second)
	defer listed()
	if _, err := turnwirev1.NewToolExecutorServiceClient(conn).ListTools(listCtx, &turnwirev1.ListToolsRequest{}, grpc.WaitForReady(true)); err != nil {
		select {
		case err := <-served:
			t.Fatalf("Serve on a stale socket returned %v; want it to serve", err)
		default:
			t.Fatalf("ListTools: %v", err)
		}
	}

	// The socket is live now: a second Serve there fails and leaves it serving.
	if err := kit.Serve(testContext(t), "unix:"+socket, nil, add); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("Serve on a live socket: %v; want address already in use", err)
	}
	if _, err := turnwirev1.NewToolExecutorServiceClient(conn).ListTools(testContext(t), &turnwirev1.ListToolsRequest{}); err != nil {
		t.Errorf("the first server after a second Serve on its socket: %v", err)
	}
	cancel()
	if err := wait(t, served, "Serve's return"); err != nil {
		t.Fatalf("Serve returned %v; want nil after its context ended", err)
	}
}
