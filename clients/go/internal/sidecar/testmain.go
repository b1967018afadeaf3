package sidecar

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"

	"turnwire.dev/go/turnwire"
)

// dialTimeout bounds the dial of a sidecar that answered its health check.
const dialTimeout = 20 * time.Second

// RunTests is a test package's TestMain body around one sidecar: it starts a
// sidecar with config (as Start), dials it with the Go client, hands both to
// use, runs the tests, then closes the client and stops the sidecar. It
// returns the exit code for os.Exit: m.Run's, or 1 when the sidecar did not
// start, could not be dialled or did not stop cleanly (said on stderr).
func RunTests(m *testing.M, config any, use func(*Sidecar, *turnwire.Client)) int {
	server, err := Start(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the sidecar:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	client, err := turnwire.Dial(ctx, server.Addr, grpc.WithInsecure())
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial the sidecar:", err)
		_ = server.Stop()
		return 1
	}
	use(server, client)
	code := m.Run()
	client.Close()
	if err := server.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return code
}
