package kit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"sync"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/internal/exactjson"
)

// Hooks are the lifecycle hooks a hook server implements (docs/semantics.md
// §3, protos/turnwire/v1/hooks.proto): set the ones you need. The sidecar
// calls only those: GetHookSubscriptions answers the hooks whose handler is
// set, in the Hook enum's order.
//
// Requests and responses are the generated types; each context is a snapshot
// of the turn (changing the request does nothing, what a handler returns is
// what counts). A nil response is "no change" (for BeforeToolCall: allow the
// call as it is). A handler's error fails the call: its gRPC status when it
// has one (status.Error), codes.Canceled or codes.DeadlineExceeded for the
// context's errors, else codes.Unknown with the error's text; the sidecar then
// applies the hook's failure mode (open: as if no change, closed: the tool
// call is blocked or the turn fails). A panic fails the call with
// codes.Internal (and is logged with its stack) instead of stopping the
// server.
//
// ctx is cancelled when the sidecar gives up on the call (its
// deadline_seconds, a cancelled turn) and carries the call's metadata
// (CallInfo: the turn's request id, the trace context), on the unary RPCs
// and the HookSession stream alike. Handlers may be called concurrently for
// different turns.
type Hooks struct {
	// IncludeMessages asks for the message history in BeforeTurn and
	// BeforeStep requests (it can be large).
	IncludeMessages bool
	// Observe lists the hooks whose handler only observes (hooks.proto,
	// GetHookSubscriptionsResponse.observed_hooks): the deciding hooks
	// Hook_HOOK_BEFORE_TURN, Hook_HOOK_BEFORE_STEP, Hook_HOOK_BEFORE_TOOL_CALL,
	// whose answers the sidecar does not wait for on HookSession and ignores,
	// and the turn's end hooks Hook_HOOK_ON_CHAT_RESPONSE,
	// Hook_HOOK_ON_CHAT_ERROR: on HookSession the sidecar still sends their
	// call, in order after the turn's other calls, but sends the client
	// TurnEnd without waiting for the server's answers, and ignores
	// OnChatError's (the error surfaces as it was). A change such a handler
	// returns is answered as no change (logged once per hook); its error still
	// fails the call. Register and Serve refuse another hook, or one whose
	// handler is not set.
	Observe []turnwirev1.Hook

	// BeforeTurn changes the turn, once per attempt, before its first step.
	BeforeTurn func(context.Context, *turnwirev1.BeforeTurnRequest) (*turnwirev1.BeforeTurnResponse, error)
	// BeforeStep changes a step, before every step.
	BeforeStep func(context.Context, *turnwirev1.BeforeStepRequest) (*turnwirev1.BeforeStepResponse, error)
	// BeforeToolCall decides each server-executed tool call: nil allows it,
	// Block, AllowWithInput and Substitute build the other decisions.
	BeforeToolCall func(context.Context, *turnwirev1.BeforeToolCallRequest) (*turnwirev1.BeforeToolCallResponse, error)
	// AfterToolCall observes each tool call's outcome.
	AfterToolCall func(context.Context, *turnwirev1.AfterToolCallRequest) error
	// OnStepFinish observes each finished step.
	OnStepFinish func(context.Context, *turnwirev1.OnStepFinishRequest) error
	// OnChunks observes a turn's streamed events, batch by batch, on one call
	// per turn (Chunks); the call ends when the handler returns (the batches it
	// did not read are read and dropped first, so the sidecar is not cut off).
	// The call is an OnChunks RPC, or on HookSession the turn's batches up to
	// the one marked last (hooks.proto, OnChunksRequest.last), queued for the
	// handler so that the stream's other calls never wait for it: at most 4096
	// events wait, the ones past that are dropped (and logged once per turn).
	OnChunks func(context.Context, *Chunks) error
	// OnChatResponse observes a finished turn, after its reply is stored.
	OnChatResponse func(context.Context, *turnwirev1.OnChatResponseRequest) error
	// ClassifyChatError classifies a failed turn's error;
	// CHAT_ERROR_CLASSIFICATION_UNSPECIFIED leaves it to the chain's others.
	ClassifyChatError func(context.Context, *turnwirev1.ClassifyChatErrorRequest) (turnwirev1.ChatErrorClassification, error)
	// OnChatError replaces the error the client sees for a failed turn.
	OnChatError func(context.Context, *turnwirev1.OnChatErrorRequest) (*turnwirev1.OnChatErrorResponse, error)
}

// subscriptions are the hooks whose handler is set, in the Hook enum's order.
func (h *Hooks) subscriptions() []turnwirev1.Hook {
	set := []struct {
		hook turnwirev1.Hook
		on   bool
	}{
		{turnwirev1.Hook_HOOK_BEFORE_TURN, h.BeforeTurn != nil},
		{turnwirev1.Hook_HOOK_BEFORE_STEP, h.BeforeStep != nil},
		{turnwirev1.Hook_HOOK_BEFORE_TOOL_CALL, h.BeforeToolCall != nil},
		{turnwirev1.Hook_HOOK_AFTER_TOOL_CALL, h.AfterToolCall != nil},
		{turnwirev1.Hook_HOOK_ON_STEP_FINISH, h.OnStepFinish != nil},
		{turnwirev1.Hook_HOOK_ON_CHUNKS, h.OnChunks != nil},
		{turnwirev1.Hook_HOOK_ON_CHAT_RESPONSE, h.OnChatResponse != nil},
		{turnwirev1.Hook_HOOK_CLASSIFY_CHAT_ERROR, h.ClassifyChatError != nil},
		{turnwirev1.Hook_HOOK_ON_CHAT_ERROR, h.OnChatError != nil},
	}
	var hooks []turnwirev1.Hook
	for _, s := range set {
		if s.on {
			hooks = append(hooks, s.hook)
		}
	}
	return hooks
}

// observed are the hooks of Observe, in the Hook enum's order.
func (h *Hooks) observed() []turnwirev1.Hook {
	var hooks []turnwirev1.Hook
	for _, hook := range h.subscriptions() {
		for _, observe := range h.Observe {
			if hook == observe {
				hooks = append(hooks, hook)
				break
			}
		}
	}
	return hooks
}

// Block is the BeforeToolCall decision not to run the call; the model is told
// reason (empty: the sidecar's `Tool "<name>" was blocked by beforeToolCall.`).
func Block(reason string) *turnwirev1.BeforeToolCallResponse {
	return &turnwirev1.BeforeToolCallResponse{Decision: &turnwirev1.BeforeToolCallResponse_Block_{
		Block: &turnwirev1.BeforeToolCallResponse_Block{Reason: reason},
	}}
}

// AllowWithInput is the BeforeToolCall decision to run the call with input
// instead (encoded as encoding/json does, numbers exact; it must encode to a
// JSON object). The sidecar does not validate it again.
func AllowWithInput(input any) (*turnwirev1.BeforeToolCallResponse, error) {
	text, err := exactjson.Encode(input)
	if err != nil {
		return nil, fmt.Errorf("kit: AllowWithInput: %w", err)
	}
	if text == "" || text[0] != '{' {
		return nil, fmt.Errorf("kit: AllowWithInput: the input must be a JSON object, not %s", text)
	}
	return &turnwirev1.BeforeToolCallResponse{Decision: &turnwirev1.BeforeToolCallResponse_AllowWithInput_{
		AllowWithInput: &turnwirev1.BeforeToolCallResponse_AllowWithInput{InputJson: text},
	}}, nil
}

// Substitute is the BeforeToolCall decision not to run the call and give the
// model output (any value encoding/json encodes) as its result.
func Substitute(output any) (*turnwirev1.BeforeToolCallResponse, error) {
	text, err := exactjson.Encode(output)
	if err != nil {
		return nil, fmt.Errorf("kit: Substitute: %w", err)
	}
	return &turnwirev1.BeforeToolCallResponse{Decision: &turnwirev1.BeforeToolCallResponse_Substitute_{
		Substitute: &turnwirev1.BeforeToolCallResponse_Substitute{OutputJson: text},
	}}, nil
}

// DecodeJSON reads JSON text of a request (ToolCallInfo.InputJson,
// AfterToolCallRequest.OutputJson, ...) into a T as encoding/json does, with
// numbers that land in an interface (any, map[string]any) as json.Number so
// that integers of any size stay exact; data after the value is an error.
func DecodeJSON[T any](text string) (T, error) {
	return exactjson.Decode[T](text)
}

// Chunks is one OnChunks call: a turn's streamed events (deltas, tool inputs
// and results, sources, files, each step's step_start), batch by batch, in
// order (hooks.proto, OnChunksRequest), from an OnChunks RPC or from a
// HookSession stream's batches of the turn (Hooks.OnChunks). Read it as
// bufio.Scanner:
//
//	for chunks.Next() {
//		for _, event := range chunks.Events() { ... }
//	}
//	return chunks.Err()
type Chunks struct {
	turn    *turnwirev1.TurnInfo
	recv    func() (*turnwirev1.OnChunksRequest, error)
	pending *turnwirev1.OnChunksRequest // the first request, read before the handler runs
	events  []*turnwirev1.TurnEvent
	err     error
}

// Turn is the turn the events belong to (from the call's first request).
func (c *Chunks) Turn() *turnwirev1.TurnInfo { return c.turn }

// Next reads the next batch; false at the end of the call or on an error
// (Err).
func (c *Chunks) Next() bool {
	if c.err != nil {
		return false
	}
	request := c.pending
	c.pending = nil
	if request == nil {
		var err error
		if request, err = c.recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				c.err = err
			}
			c.events = nil
			return false
		}
	}
	c.events = request.GetEvents()
	return true
}

// Events are the current batch's events, in order.
func (c *Chunks) Events() []*turnwirev1.TurnEvent { return c.events }

// Err is what ended the call early (its cancellation), nil at its normal end.
func (c *Chunks) Err() error { return c.err }

// maxWaitingChunks is how many events of a turn may wait for its OnChunks
// handler on a HookSession stream; the stream never waits for the handler
// (hooks.proto, HookSessionRequest: a batch is answered once queued).
const maxWaitingChunks = 4096

// chunksQueue is the input of a turn's OnChunks handler on a HookSession
// stream: the session puts the batches, the handler's Chunks takes them.
// Batches without events are not queued (the last one only ends the input).
type chunksQueue struct {
	turn    string        // the turn's parent request id, for the log
	ready   chan struct{} // a batch or the end was put (1-buffered)
	mu      sync.Mutex
	batches [][]*turnwirev1.TurnEvent
	waiting int  // events in batches
	ended   bool // the last batch was put
	closed  bool // the handler returned: batches are dropped
	dropped bool // a drop was logged
}

func newChunksQueue(turn string) *chunksQueue {
	return &chunksQueue{turn: turn, ready: make(chan struct{}, 1)}
}

// put queues events, those past maxWaitingChunks waiting dropped (logged
// once per turn); last ends the input after them. It never waits.
func (q *chunksQueue) put(events []*turnwirev1.TurnEvent, last bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	if room := maxWaitingChunks - q.waiting; len(events) > room {
		if !q.dropped {
			q.dropped = true
			log.Printf("kit: OnChunks of turn %q reads too slowly: events past %d waiting are dropped", q.turn, maxWaitingChunks)
		}
		events = events[:room]
	}
	if len(events) > 0 {
		q.batches = append(q.batches, events)
		q.waiting += len(events)
	}
	q.ended = q.ended || last
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// next is the next batch, waiting for one: io.EOF after the last batch, the
// status of ctx's end once ctx ends (as an OnChunks RPC's Recv once the RPC
// is cancelled).
func (q *chunksQueue) next(ctx context.Context) (*turnwirev1.OnChunksRequest, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, toStatus(err)
		}
		q.mu.Lock()
		batches, ended := q.batches, q.ended
		if len(batches) > 0 {
			q.batches, q.waiting = batches[1:], q.waiting-len(batches[0])
		}
		q.mu.Unlock()
		switch {
		case len(batches) > 0:
			return &turnwirev1.OnChunksRequest{Events: batches[0]}, nil
		case ended:
			return nil, io.EOF
		}
		select {
		case <-q.ready:
		case <-ctx.Done():
		}
	}
}

// close drops the batches waiting and any put later (the handler returned).
func (q *chunksQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed, q.batches, q.waiting = true, nil, 0
}
