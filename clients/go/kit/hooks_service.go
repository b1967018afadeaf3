package kit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
)

// observable lists the hooks Hooks.Observe may name (hooks.proto GetHookSubscriptionsResponse.observed_hooks).
const observable = "HOOK_BEFORE_TURN, HOOK_BEFORE_STEP, HOOK_BEFORE_TOOL_CALL, HOOK_ON_CHAT_RESPONSE, HOOK_ON_CHAT_ERROR"

// hooksService serves turnwire.v1.TurnHooksService from Hooks: each unary RPC
// calls its handler; HookSession calls the same RPC methods for each call of
// the stream, in order, one at a time (hooks.proto, HookSessionRequest), and
// feeds a turn's OnChunks batches to one OnChunks handler (sessionChunks).
type hooksService struct {
	turnwirev1.UnimplementedTurnHooksServiceServer
	hooks Hooks
}

// newHooksService serves hooks, the handlers of hooks.Observe through
// ignoreChanges (OnChatResponse's handler answers nothing anyway). It fails
// when hooks set no handler, or when Observe lists a hook that cannot be
// observed or whose handler is not set.
func newHooksService(hooks Hooks) (*hooksService, error) {
	if len(hooks.subscriptions()) == 0 {
		return nil, errors.New("kit: the Hooks set no handler")
	}
	s := &hooksService{hooks: hooks}
	for _, hook := range hooks.Observe {
		var set bool
		switch hook {
		case turnwirev1.Hook_HOOK_BEFORE_TURN:
			set, s.hooks.BeforeTurn = hooks.BeforeTurn != nil, ignoreChanges("BeforeTurn", hooks.BeforeTurn)
		case turnwirev1.Hook_HOOK_BEFORE_STEP:
			set, s.hooks.BeforeStep = hooks.BeforeStep != nil, ignoreChanges("BeforeStep", hooks.BeforeStep)
		case turnwirev1.Hook_HOOK_BEFORE_TOOL_CALL:
			set, s.hooks.BeforeToolCall = hooks.BeforeToolCall != nil, ignoreChanges("BeforeToolCall", hooks.BeforeToolCall)
		case turnwirev1.Hook_HOOK_ON_CHAT_RESPONSE:
			set = hooks.OnChatResponse != nil
		case turnwirev1.Hook_HOOK_ON_CHAT_ERROR:
			set, s.hooks.OnChatError = hooks.OnChatError != nil, ignoreChanges("OnChatError", hooks.OnChatError)
		case turnwirev1.Hook_HOOK_AFTER_TOOL_CALL, turnwirev1.Hook_HOOK_ON_STEP_FINISH, turnwirev1.Hook_HOOK_ON_CHUNKS:
			// Posted on a HookSession already: observing one declares nothing.
			return nil, fmt.Errorf("kit: Hooks.Observe lists %v, not a hook you can observe (%s); the sidecar never waits for it on a HookSession anyway", hook, observable)
		default:
			return nil, fmt.Errorf("kit: Hooks.Observe lists %v, not a hook you can observe (%s)", hook, observable)
		}
		if !set {
			return nil, fmt.Errorf("kit: Hooks.Observe lists %v, whose handler is not set", hook)
		}
	}
	return s, nil
}

func (s *hooksService) GetHookSubscriptions(context.Context, *turnwirev1.GetHookSubscriptionsRequest) (*turnwirev1.GetHookSubscriptionsResponse, error) {
	return &turnwirev1.GetHookSubscriptionsResponse{
		Hooks:           s.hooks.subscriptions(),
		IncludeMessages: s.hooks.IncludeMessages,
		ObservedHooks:   s.hooks.observed(),
		HookSession:     true,
		// Each session call's turn is taken from the call: streams may carry
		// turns one after another.
		ReuseHookSession: true,
		// OnChunks batches come on the session too (onChunksCall).
		HookSessionChunks: true,
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

// ignoreChanges adapts the handler (nil allowed) of a hook of Hooks.Observe:
// the sidecar ignores its answer (hooks.proto, observed_hooks), so a change it
// returns is answered as no change, and logged the first time. Its error
// still fails the call.
func ignoreChanges[Req any, Resp proto.Message](hook string, handler func(context.Context, Req) (Resp, error)) func(context.Context, Req) (Resp, error) {
	if handler == nil {
		return nil
	}
	var warn sync.Once
	return func(ctx context.Context, request Req) (Resp, error) {
		response, err := handler(ctx, request)
		if err != nil || proto.Size(response) == 0 {
			return response, err
		}
		warn.Do(func() { log.Printf("kit: %s is observed (Hooks.Observe): its answer is ignored", hook) })
		var none Resp
		return none, nil
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

var errNoOnChunks = status.Error(codes.Unimplemented, "kit: this server does not implement OnChunks")

// runChunks runs the OnChunks handler on chunks: the call's status.
func (s *hooksService) runChunks(ctx context.Context, chunks *Chunks) error {
	_, err := run(ctx, "OnChunks", func(ctx context.Context, c *Chunks) (struct{}, error) {
		return struct{}{}, s.hooks.OnChunks(ctx, c)
	}, chunks)
	return err
}

func (s *hooksService) OnChunks(stream turnwirev1.TurnHooksService_OnChunksServer) error {
	if s.hooks.OnChunks == nil {
		return errNoOnChunks
	}
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return stream.SendAndClose(&turnwirev1.OnChunksResponse{})
	}
	if err != nil {
		return err
	}
	chunks := &Chunks{turn: first.GetTurn(), recv: stream.Recv, pending: first}
	if err := s.runChunks(stream.Context(), chunks); err != nil {
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
	// The OnChunks handlers the stream started and did not end (no `last`
	// came) are cancelled and waited for when it ends, as if their OnChunks
	// RPC were cancelled.
	ctx, cancel := context.WithCancel(stream.Context())
	chunks := &sessionChunks{running: map[string]*chunksTurn{}}
	defer func() {
		cancel()
		chunks.handlers.Wait()
	}()
	incoming, _ := metadata.FromIncomingContext(ctx)
	for {
		request, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		// A request's answers go together once its last call is done: the
		// sidecar waits for at most one call of a request, its last
		// (hooks.proto, HookSessionRequest).
		answers := make([]*turnwirev1.HookAnswer, 0, len(request.GetCalls()))
		for _, call := range request.GetCalls() {
			answers = append(answers, s.sessionAnswer(callContext(ctx, incoming, call), call, chunks))
		}
		if err := stream.Send(&turnwirev1.HookSessionResponse{Answers: answers}); err != nil {
			return err
		}
	}
}

// sessionChunks are the OnChunks handlers a HookSession stream runs, by turn
// (HookCall.parent_request_id); only the stream's loop uses running.
type sessionChunks struct {
	running  map[string]*chunksTurn
	handlers sync.WaitGroup
}

// chunksTurn is the OnChunks handler of one turn of a HookSession stream.
type chunksTurn struct {
	queue *chunksQueue
	done  chan struct{} // closed when the handler has returned
	err   error         // the handler's status, set before done is closed
}

// onChunksCall handles an OnChunks batch of a HookSession stream
// (hooks.proto, HookSessionRequest and OnChunksRequest.last): the turn's
// first batch starts the OnChunks handler, with ctx (the batch's call) and
// the batch's turn; each batch's events are queued for it (at most
// maxWaitingChunks waiting, chunksQueue). A batch is answered once queued,
// never after the handler's work; the `last` batch ends the handler's input
// and is answered once the handler has returned, with its status, and a
// batch of the turn after it starts a new handler, as a new OnChunks RPC
// would.
func (s *hooksService) onChunksCall(ctx context.Context, chunks *sessionChunks, key string, r *turnwirev1.OnChunksRequest) (*turnwirev1.OnChunksResponse, error) {
	if s.hooks.OnChunks == nil {
		return nil, errNoOnChunks
	}
	turn := chunks.running[key]
	if turn == nil {
		turn = &chunksTurn{queue: newChunksQueue(key), done: make(chan struct{})}
		chunks.running[key] = turn
		input := &Chunks{turn: r.GetTurn(), recv: func() (*turnwirev1.OnChunksRequest, error) {
			return turn.queue.next(ctx)
		}}
		chunks.handlers.Add(1)
		go func() {
			defer chunks.handlers.Done()
			turn.err = s.runChunks(ctx, input)
			turn.queue.close() // what it left unread is dropped, as on the RPC
			close(turn.done)
		}()
	}
	turn.queue.put(r.GetEvents(), r.GetLast())
	if !r.GetLast() {
		return &turnwirev1.OnChunksResponse{}, nil
	}
	delete(chunks.running, key)
	<-turn.done
	if turn.err != nil {
		return nil, turn.err
	}
	return &turnwirev1.OnChunksResponse{}, nil
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

// sessionAnswer handles one call of a HookSession stream as its unary RPC
// (an OnChunks batch: onChunksCall): the response, or the status the RPC
// would have failed with.
func (s *hooksService) sessionAnswer(ctx context.Context, call *turnwirev1.HookCall, chunks *sessionChunks) *turnwirev1.HookAnswer {
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
	case *turnwirev1.HookCall_OnChunks:
		var r *turnwirev1.OnChunksResponse
		if r, err = s.onChunksCall(ctx, chunks, call.GetParentRequestId(), hook.OnChunks); err == nil {
			answer.Hook = &turnwirev1.HookAnswer_OnChunks{OnChunks: r}
		}
	default:
		err = status.Error(codes.Unimplemented, "kit: a hook call this kit does not know")
	}
	if err != nil {
		answer.Error = status.Convert(err).Proto()
	}
	return answer
}
