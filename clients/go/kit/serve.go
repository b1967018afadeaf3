package kit

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
)

// stopGrace is how long Serve lets running calls finish once its context
// ends, before it cuts them (HookSession streams last as long as their turn).
const stopGrace = 5 * time.Second

// Register adds to server turnwire.v1.TurnHooksService for hooks (unless nil)
// and turnwire.v1.ToolExecutorService for tools (unless none), for a server
// of your own (TLS credentials, interceptors, other services). It fails when
// there is nothing to serve, a Hooks sets no handler or its Observe lists a
// hook that cannot be observed or whose handler is not set, a tool's name
// is not 1-64 of A-Z a-z 0-9 _ -, two tools share a name, or a tool's input
// is not a JSON object type.
func Register(server *grpc.Server, hooks *Hooks, tools ...ToolDefinition) error {
	if hooks == nil && len(tools) == 0 {
		return errors.New("kit: no hooks and no tools to serve")
	}
	var hooksServer *hooksService
	if hooks != nil {
		var err error
		if hooksServer, err = newHooksService(*hooks); err != nil {
			return err
		}
	}
	var executor *toolsService
	if len(tools) > 0 {
		var err error
		if executor, err = newToolsService(tools); err != nil {
			return err
		}
	}
	if hooksServer != nil {
		turnwirev1.RegisterTurnHooksServiceServer(server, hooksServer)
	}
	if executor != nil {
		turnwirev1.RegisterToolExecutorServiceServer(server, executor)
	}
	return nil
}

// Serve serves hooks (nil: none) and tools on one plaintext gRPC server at
// addr (HOST:PORT, or unix:PATH), the address the sidecar's config names
// (middleware `remote.address`, `tools.hosts[].address`), until ctx ends;
// then it stops taking calls, lets running ones finish for up to 5 s, cuts
// the rest (their contexts are cancelled) and returns nil. It returns
// Register's errors and the listener's. A socket file that a killed process
// left at PATH (nothing accepts on it) is removed first, so a restart after a
// crash serves again, as the Python kit does; one a live server listens on is
// left alone (the listener's "address already in use"). For TLS, build the
// grpc.Server yourself and Register.
func Serve(ctx context.Context, addr string, hooks *Hooks, tools ...ToolDefinition) error {
	server := grpc.NewServer()
	if err := Register(server, hooks, tools...); err != nil {
		return err
	}
	network := "tcp"
	if path := strings.TrimPrefix(addr, "unix:"); path != addr {
		network, addr = "unix", path
		removeStaleSocket(path)
	}
	listener, err := net.Listen(network, addr)
	if err != nil {
		return err
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		timer := time.AfterFunc(stopGrace, server.Stop)
		defer timer.Stop()
		server.GracefulStop()
	}()
	err = server.Serve(listener)
	if ctx.Err() != nil {
		<-stopped
		return nil
	}
	return err
}

// removeStaleSocket removes the socket file at path when no process accepts
// connections on it (a crashed server's leftover, which would make Listen fail
// with "address already in use"). Anything else at path is left to Listen.
func removeStaleSocket(path string) {
	info, err := os.Lstat(path)
	if err != nil || info.Mode().Type() != fs.ModeSocket {
		return
	}
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		conn.Close() // a live server: Listen reports the address in use
		return
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		os.Remove(path)
	}
}
