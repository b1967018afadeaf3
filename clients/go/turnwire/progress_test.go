package turnwire_test

import (
	"testing"

	"google.golang.org/grpc"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/turnwire"
)

// silentTurn runs the "silent" script (2.5 s without an event, so the sidecar
// sends Progress keepalives every 0.5 s) on c and returns its events.
func silentTurn(t *testing.T, c *turnwire.Client, conversation string) []*turnwirev1.TurnEvent {
	t.Helper()
	stream, err := c.Chat(testContext(t), &turnwirev1.ChatRequest{
		ConversationId: conversation,
		RequestId:      conversation,
		Model:          "scripted:silent",
		Message:        turnwire.UserText("think"),
	})
	if err != nil {
		t.Fatal(err)
	}
	events := collect(t, stream)
	if len(events) == 0 || events[len(events)-1].GetTurnEnd().GetStatus() != turnwirev1.TurnStatus_TURN_STATUS_COMPLETED {
		t.Fatalf("the turn did not complete: %v", events)
	}
	return events
}

func TestProgressIsSkippedByDefault(t *testing.T) {
	for i, event := range silentTurn(t, client, "go-progress-skipped") {
		if event.GetProgress() != nil || event.GetSequenceNumber() != int64(i+1) {
			t.Fatalf("event %d: %v; want the turn's events alone, numbered 1..N", i, event)
		}
	}
}

func TestIncludeProgressYieldsKeepalives(t *testing.T) {
	c, err := turnwire.Dial(testContext(t), server.Addr, grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.IncludeProgress = true
	var progress []*turnwirev1.TurnEvent
	for _, event := range silentTurn(t, c, "go-progress") {
		if event.GetProgress() == nil {
			continue
		}
		progress = append(progress, event)
		if event.GetSequenceNumber() != 0 || event.GetRequestId() != "go-progress" ||
			event.GetProgress().GetPhase() != turnwirev1.ProgressPhase_PROGRESS_PHASE_MODEL {
			t.Errorf("keepalive %v; want sequence number 0, the turn's request id, PROGRESS_PHASE_MODEL", event)
		}
	}
	if len(progress) == 0 {
		t.Fatal("no Progress during 2.5 s of silence")
	}
}
