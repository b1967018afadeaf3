package turnwire_test

import (
	"regexp"
	"strings"
	"testing"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/turnwire"
)

// Issue 32 item 12: a turn that failed at the provider is retried by sending
// the same request again; Chat gave it a request id and its message an id
// derived from it, so the sidecar stores the question once (before: the retry
// was ALREADY_EXISTS, and a new request stored the question twice).
func TestSendingAFailedChatAgainRetriesItAndStoresTheQuestionOnce(t *testing.T) {
	ctx := testContext(t)
	req := &turnwirev1.ChatRequest{
		ConversationId: "go-retry",
		Message:        turnwire.UserText("q"),
		Model:          "scripted:down",
	}
	stream, err := client.Chat(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	end, err := stream.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if end.GetStatus() != turnwirev1.TurnStatus_TURN_STATUS_ERROR {
		t.Fatalf("first attempt ended %v; want ERROR", end.GetStatus())
	}
	if !regexp.MustCompile(`^r-[0-9a-f]{32}$`).MatchString(req.RequestId) || req.Message.Id != req.RequestId+".m0" {
		t.Fatalf("ids filled in: request %q, message %q", req.RequestId, req.Message.Id)
	}
	req.Model = "" // the provider is back: the default model
	stream, err = client.Chat(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if end, err = stream.Wait(); err != nil {
		t.Fatal(err)
	}
	if end.GetStatus() != turnwirev1.TurnStatus_TURN_STATUS_COMPLETED {
		t.Fatalf("the retry ended %v (%v); want COMPLETED", end.GetStatus(), end.GetError())
	}
	conversation, err := client.Service().GetConversation(ctx, &turnwirev1.GetConversationRequest{ConversationId: "go-retry"})
	if err != nil {
		t.Fatal(err)
	}
	var roles []turnwirev1.Role
	for _, message := range conversation.GetConversation().GetMessages() {
		roles = append(roles, message.GetRole())
	}
	if len(roles) != 2 || roles[0] != turnwirev1.Role_ROLE_USER || roles[1] != turnwirev1.Role_ROLE_ASSISTANT {
		t.Fatalf("stored roles %v; want [USER ASSISTANT]", roles)
	}
}

func TestInputMessageIDFitsTheIDPattern(t *testing.T) {
	if got := turnwire.InputMessageID("r1", 2); got != "r1.m2" {
		t.Errorf("InputMessageID(r1, 2) = %q", got)
	}
	long := turnwire.InputMessageID(strings.Repeat("r", 128), 0)
	if !regexp.MustCompile(`^m0-[0-9a-f]{64}$`).MatchString(long) {
		t.Errorf("a 128-character request id gives %q; want m0-<sha256>", long)
	}
}
