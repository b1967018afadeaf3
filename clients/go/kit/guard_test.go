package kit

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
)

// A handler that answers after the call's context ended (it ignored the
// cancellation) fails the call: the answer is late, not a "no change".
func TestALateAnswerIsNotSent(t *testing.T) {
	service := &hooksService{hooks: Hooks{
		BeforeTurn: func(context.Context, *turnwirev1.BeforeTurnRequest) (*turnwirev1.BeforeTurnResponse, error) {
			system := "late"
			return &turnwirev1.BeforeTurnResponse{System: &system}, nil
		},
	}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	response, err := service.BeforeTurn(ctx, &turnwirev1.BeforeTurnRequest{})
	if status.Code(err) != codes.Canceled || response != nil {
		t.Fatalf("BeforeTurn after its context ended: %v, %v; want Canceled", response, err)
	}
	answer := service.sessionAnswer(ctx, &turnwirev1.HookCall{Id: 3, Hook: &turnwirev1.HookCall_BeforeTurn{BeforeTurn: &turnwirev1.BeforeTurnRequest{}}}, nil)
	if codes.Code(answer.GetError().GetCode()) != codes.Canceled || answer.GetHook() != nil || answer.GetId() != 3 {
		t.Fatalf("the session's answer %v; want a Canceled error", answer)
	}
}
