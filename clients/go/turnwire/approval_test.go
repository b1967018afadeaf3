package turnwire_test

import (
	"google.golang.org/grpc"

	"testing"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/turnwire"
)

// askForApproval runs a turn whose model calls get_current_time, a tool that
// waits for approval, and returns that call's id.
func askForApproval(t *testing.T, conversation string) string {
	t.Helper()
	stream, err := client.Chat(testContext(t), &turnwirev1.ChatRequest{
		ConversationId: conversation,
		Message:        turnwire.UserText("What time is it?"),
		Model:          "scripted:ask-time",
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, event := range collect(t, stream) {
		if request := event.GetToolApprovalRequest(); request != nil {
			return request.GetToolCallId()
		}
	}
	t.Fatal("the turn asked for no approval")
	return ""
}

// approve approves callID and returns the events of the stream that follows.
func approve(t *testing.T, conversation, callID string, opts ...grpc.CallOption) []*turnwirev1.TurnEvent {
	t.Helper()
	stream, err := client.SubmitToolApprovals(testContext(t), &turnwirev1.SubmitToolApprovalsRequest{
		ConversationId: conversation,
		Approvals:      []*turnwirev1.ToolApproval{{ToolCallId: callID, Approved: true}},
		Model:          "scripted:done",
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return collect(t, stream)
}

// Issue 32 item 15: an approval continues by default, as in the Python and
// TypeScript clients: the approved tool runs and the model answers in the
// same stream (before: AutoContinue was the proto3 zero value, so the stream
// was a lone SKIPPED TurnEnd and the approved tool never ran).
func TestAnApprovedToolRunsByDefault(t *testing.T) {
	callID := askForApproval(t, "go-approve")
	events := approve(t, "go-approve", callID)
	var ran bool
	var text string
	for _, event := range events {
		if output := event.GetToolOutputAvailable(); output != nil && output.GetToolCallId() == callID {
			ran = output.GetToolName() == "get_current_time"
		}
		text += event.GetTextDelta().GetDelta()
	}
	end := events[len(events)-1].GetTurnEnd()
	if !ran || end.GetStatus() != turnwirev1.TurnStatus_TURN_STATUS_COMPLETED || text != "Done." {
		t.Fatalf("approved tool ran: %v, end %v (%v), text %q; want it run, COMPLETED, %q",
			ran, end.GetStatus(), end.GetError(), text, "Done.")
	}
}

// WithoutAutoContinue stores the approval only: one SKIPPED TurnEnd, the
// tool not run.
func TestWithoutAutoContinueOnlyStoresTheApproval(t *testing.T) {
	callID := askForApproval(t, "go-approve-only")
	events := approve(t, "go-approve-only", callID, turnwire.WithoutAutoContinue())
	if len(events) != 1 || events[0].GetTurnEnd().GetStatus() != turnwirev1.TurnStatus_TURN_STATUS_SKIPPED {
		t.Fatalf("events %v; want one SKIPPED TurnEnd", events)
	}
}
