package kit

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
)

// hooksService serves turnwire.v1.TurnHooksService from Hooks: each unary RPC
// calls its handler; HookSession calls the same RPC methods for each call of
// the stream, in order, one at a time (hooks.proto, HookSessionRequest).
type hooksService struct {
	turnwirev1.UnimplementedTurnHooksServiceServer
	hooks Hooks
}

func (s *hooksService) GetHookSubscriptions(context.Context, *turnwirev1.GetHookSubscriptionsRequest) (*turnwirev1.GetHookSubscriptionsResponse, error) {
	return &turnwirev1.GetHookSubscriptionsResponse{
		Hooks:           s.hooks.subscriptions(),
		IncludeMessages: s.hooks.IncludeMessages,
		HookSession:     true,
		// Each session call's turn is taken from the call: streams may carry
		// turns one after another.
		ReuseHookSession: true,
	}, nil
}

// answer calls handler (nil: the hook is not subscribed, codes.Unimplemented)
// and gives a nil response as an empty one of type Resp.
func answer[Req any, Resp any, PResp interface {
	*Resp
}](ctx context.Context, hook string, handler func(context.Context, Req) (PResp, error), request Req) (PResp, error) {
	if handler == nil {
		return nil, status.Errorf(codes.Unimplemented, "kit: this server does not implement %s", hook)
	}
	response, err := run(ctx, hook, handler, request)
	if err != nil {
		return nil, err
	}
	if response == nil {
		response = new(Resp)
	}
	return response, nil
}

// observe adapts an observing handler (nil allowed) to answer's shape.
func observe[Req any, Resp any](handler func(context.Context, Req) error) func(context.Context, Req) (*Resp, error) {
	if handler == nil {
		return nil
	}
	return func(ctx context.Context, request Req) (*Resp, error) {
		return nil, handler(ctx, request)
	}
}

func (s *hooksService) BeforeTurn(ctx context.Context, r *turnwirev1.BeforeTurnRequest) (*turnwirev1.BeforeTurnResponse, error) {
	return answer(ctx, "BeforeTurn", s.hooks.BeforeTurn, r)
}

func (s *hooksService) BeforeStep(ctx context.Context, r *turnwirev1.BeforeStepRequest) (*turnwirev1.BeforeStepResponse, error) {
	return answer(ctx, "BeforeStep", s.hooks.BeforeStep, r)
}

func (s *hooksService) BeforeToolCall(ctx context.Context, r *turnwirev1.BeforeToolCallRequest) (*turnwirev1.BeforeToolCallResponse, error) {
	return answer(ctx, "BeforeToolCall", s.hooks.BeforeToolCall, r)
}

func (s *hooksService) AfterToolCall(ctx context.Context, r *turnwirev1.AfterToolCallRequest) (*turnwirev1.AfterToolCallResponse, error) {
	return answer(ctx, "AfterToolCall", observe[*turnwirev1.AfterToolCallRequest, turnwirev1.AfterToolCallResponse](s.hooks.AfterToolCall), r)
}

func (s *hooksService) OnStepFinish(ctx context.Context, r *turnwirev1.OnStepFinishRequest) (*turnwirev1.OnStepFinishResponse, error) {
	return answer(ctx, "OnStepFinish", observe[*turnwirev1.OnStepFinishRequest, turnwirev1.OnStepFinishResponse](s.hooks.OnStepFinish), r)
}

func (s *hooksService) OnChatResponse(ctx context.Context, r *turnwirev1.OnChatResponseRequest) (*turnwirev1.OnChatResponseResponse, error) {
	return answer(ctx, "OnChatResponse", observe[*turnwirev1.OnChatResponseRequest, turnwirev1.OnChatResponseResponse](s.hooks.OnChatResponse), r)
}

func (s *hooksService) ClassifyChatError(ctx context.Context, r *turnwirev1.ClassifyChatErrorRequest) (*turnwirev1.ClassifyChatErrorResponse, error) {
	var handler func(context.Context, *turnwirev1.ClassifyChatErrorRequest) (*turnwirev1.ClassifyChatErrorResponse, error)
	if classify := s.hooks.ClassifyChatError; classify != nil {
		handler = func(ctx context.Context, r *turnwirev1.ClassifyChatErrorRequest) (*turnwirev1.ClassifyChatErrorResponse, error) {
			classification, err := classify(ctx, r)
			return &turnwirev1.ClassifyChatErrorResponse{Classification: classification}, err
		}
	}
	return answer(ctx, "ClassifyChatError", handler, r)
}

func (s *hooksService) OnChatError(ctx context.Context, r *turnwirev1.OnChatErrorRequest) (*turnwirev1.OnChatErrorResponse, error) {
	return answer(ctx, "OnChatError", s.hooks.OnChatError, r)
}

func (s *hooksService) OnChunks(stream turnwirev1.TurnHooksService_OnChunksServer) error {
	if s.hooks.OnChunks == nil {
		return status.Error(codes.Unimplemented, "kit: this server does not implement OnChunks")
	}
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return stream.SendAndClose(&turnwirev1.OnChunksResponse{})
	}
	if err != nil {
		return err
	}
	chunks := &Chunks{turn: first.GetTurn(), recv: stream.Recv, pending: first}
	if _, err := run(stream.Context(), "OnChunks", func(ctx context.Context, c *Chunks) (struct{}, error) {
		return struct{}{}, s.hooks.OnChunks(ctx, c)
	}, chunks); err != nil {
		return err
	}
	for chunks.Next() {
	}
	if err := chunks.Err(); err != nil {
		return err
	}
	return stream.SendAndClose(&turnwirev1.OnChunksResponse{})
}

func (s *hooksService) HookSession(stream turnwirev1.TurnHooksService_HookSessionServer) error {
	ctx := stream.Context()
	incoming, _ := metadata.FromIncomingContext(ctx)
	for {
		request, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, call := range request.GetCalls() {
			answer := s.sessionAnswer(callContext(ctx, incoming, call), call)
			if err := stream.Send(&turnwirev1.HookSessionResponse{Answers: []*turnwirev1.HookAnswer{answer}}); err != nil {
				return err
			}
		}
	}
}

// callContext is the stream's context with the call's trace context and turn
// added to its metadata, as a unary RPC of the call would carry them (the
// stream's metadata names only its first turn when the sidecar reuses it).
func callContext(ctx context.Context, incoming metadata.MD, call *turnwirev1.HookCall) context.Context {
	trace, parent := call.GetTraceContext(), call.GetParentRequestId()
	streams := incoming.Get(ParentRequestMetadata)
	sameParent := parent == "" || (len(streams) == 1 && streams[0] == parent)
	if len(trace) == 0 && sameParent {
		return ctx
	}
	md := incoming.Copy()
	for key, value := range trace {
		md.Set(key, value)
	}
	if !sameParent {
		md.Set(ParentRequestMetadata, parent)
	}
	return metadata.NewIncomingContext(ctx, md)
}

// sessionAnswer handles one call of a HookSession stream as its unary RPC:
// the response, or the status the RPC would have failed with.
func (s *hooksService) sessionAnswer(ctx context.Context, call *turnwirev1.HookCall) *turnwirev1.HookAnswer {
	answer := &turnwirev1.HookAnswer{Id: call.GetId()}
	var err error
	switch hook := call.GetHook().(type) {
	case *turnwirev1.HookCall_BeforeTurn:
		var r *turnwirev1.BeforeTurnResponse
		if r, err = s.BeforeTurn(ctx, hook.BeforeTurn); err == nil {
			answer.Hook = &turnwirev1.HookAnswer_BeforeTurn{BeforeTurn: r}
		}
	case *turnwirev1.HookCall_BeforeStep:
		var r *turnwirev1.BeforeStepResponse
		if r, err = s.BeforeStep(ctx, hook.BeforeStep); err == nil {
			answer.Hook = &turnwirev1.HookAnswer_BeforeStep{BeforeStep: r}
		}
	case *turnwirev1.HookCall_BeforeToolCall:
		var r *turnwirev1.BeforeToolCallResponse
		if r, err = s.BeforeToolCall(ctx, hook.BeforeToolCall); err == nil {
			answer.Hook = &turnwirev1.HookAnswer_BeforeToolCall{BeforeToolCall: r}
		}
	case *turnwirev1.HookCall_AfterToolCall:
		var r *turnwirev1.AfterToolCallResponse
		if r, err = s.AfterToolCall(ctx, hook.AfterToolCall); err == nil {
			answer.Hook = &turnwirev1.HookAnswer_AfterToolCall{AfterToolCall: r}
		}
	case *turnwirev1.HookCall_OnStepFinish:
		var r *turnwirev1.OnStepFinishResponse
		if r, err = s.OnStepFinish(ctx, hook.OnStepFinish); err == nil {
			answer.Hook = &turnwirev1.HookAnswer_OnStepFinish{OnStepFinish: r}
		}
	case *turnwirev1.HookCall_OnChatResponse:
		var r *turnwirev1.OnChatResponseResponse
		if r, err = s.OnChatResponse(ctx, hook.OnChatResponse); err == nil {
			answer.Hook = &turnwirev1.HookAnswer_OnChatResponse{OnChatResponse: r}
		}
	case *turnwirev1.HookCall_ClassifyChatError:
		var r *turnwirev1.ClassifyChatErrorResponse
		if r, err = s.ClassifyChatError(ctx, hook.ClassifyChatError); err == nil {
			answer.Hook = &turnwirev1.HookAnswer_ClassifyChatError{ClassifyChatError: r}
		}
	case *turnwirev1.HookCall_OnChatError:
		var r *turnwirev1.OnChatErrorResponse
		if r, err = s.OnChatError(ctx, hook.OnChatError); err == nil {
			answer.Hook = &turnwirev1.HookAnswer_OnChatError{OnChatError: r}
		}
	default:
		err = status.Error(codes.Unimplemented, "kit: a hook call this kit does not know")
	}
	if err != nil {
		answer.Error = status.Convert(err).Proto()
	}
	return answer
}
