package turnwire_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/turnwire"
)

// Issue 32 item 14, the Go side: a request over the sidecar's
// limits.max_receive_message_bytes (16 MiB by default; gRPC-Go sends any
// size) ends at once with RESOURCE_EXHAUSTED, as in the Python and TypeScript
// clients, and the connection serves the next call.
func TestARequestOverTheSidecarLimitEndsResourceExhausted(t *testing.T) {
	ctx := testContext(t)
	began := time.Now()
	stream, err := client.Chat(ctx, &turnwirev1.ChatRequest{
		ConversationId: "go-oversized",
		Message:        turnwire.UserText(strings.Repeat("y", 17<<20)),
	})
	if err == nil {
		_, err = stream.Wait()
	}
	var e *turnwire.Error
	if !errors.As(err, &e) || e.Code != codes.ResourceExhausted {
		t.Fatalf("a 17 MiB message ended with %v after %v; want RESOURCE_EXHAUSTED", err, time.Since(began))
	}
	stream, err = client.Chat(ctx, &turnwirev1.ChatRequest{
		ConversationId: "go-oversized-after",
		Message:        turnwire.UserText("hello"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if end, err := stream.Wait(); err != nil || end.GetStatus() != turnwirev1.TurnStatus_TURN_STATUS_COMPLETED {
		t.Fatalf("the next call ended %v, %v; want COMPLETED", end.GetStatus(), err)
	}
}
