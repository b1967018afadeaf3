package turnwire

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc/metadata"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
)

// EventBatchesMetadata is the metadata key by which a call asks for event
// batches: the sidecar may then send the events that are ready at once in
// one message, after its Event in MoreEvents (docs/semantics.md §10, "Event
// batches"). Every Stream of this package asks, and hands the events out one
// by one.
const EventBatchesMetadata = "turnwire-event-batches"

// eventResponse is what every turn-running RPC streams: a message holding a
// TurnEvent and the events batched after it (ChatResponse,
// SaveMessagesResponse, ...).
type eventResponse interface {
	GetEvent() *turnwirev1.TurnEvent
	GetMoreEvents() []*turnwirev1.TurnEvent
}

// streamContext is the context of a turn-streaming call: cancellable (the
// Stream's Close), asking for event batches.
func streamContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithCancel(metadata.AppendToOutgoingContext(ctx, EventBatchesMetadata, "1"))
}

// Stream iterates over the events of one turn-running call:
//
//	defer stream.Close()
//	for stream.Next() {
//		event := stream.Event()
//		...
//	}
//	if err := stream.Err(); err != nil { ... }
//
// The last event of a complete stream holds a TurnEnd (see End). A turn that
// fails while running still ends the call cleanly: its TurnEnd has status
// TURN_STATUS_ERROR and an error (FromStatus decodes it); Err reports only
// failed calls. A Stream is for one goroutine.
type Stream struct {
	recv     func() (eventResponse, error)
	cancel   context.CancelFunc
	progress bool
	event    *turnwirev1.TurnEvent
	more     []*turnwirev1.TurnEvent // a batch's events not handed out yet
	end      *turnwirev1.TurnEnd
	err      error
	done     bool
}

// openStream is the Stream of a call that started with err (and whose
// context cancel cancels), receiving with recv; it yields Progress events
// when c.IncludeProgress is set.
func (c *Client) openStream(cancel context.CancelFunc, err error, recv func() (eventResponse, error)) (*Stream, error) {
	if err != nil {
		cancel()
		return nil, err
	}
	return &Stream{recv: recv, cancel: cancel, progress: c.IncludeProgress}, nil
}

// Next receives the next event; false at the end of the stream or on an
// error (then see Err). Progress keepalives are skipped unless the Client's
// IncludeProgress was set.
func (s *Stream) Next() bool {
	for !s.done {
		if len(s.more) > 0 {
			event := s.more[0]
			s.more = s.more[1:]
			if s.take(event) {
				return true
			}
			continue
		}
		response, err := s.recv()
		if err != nil {
			s.done = true
			s.event = nil
			if !errors.Is(err, io.EOF) {
				s.err = err
			}
			s.cancel() // releases the call's context
			return false
		}
		s.more = response.GetMoreEvents()
		if s.take(response.GetEvent()) {
			return true
		}
	}
	return false
}

// take makes event the current one; false for a Progress keepalive the
// Stream skips.
func (s *Stream) take(event *turnwirev1.TurnEvent) bool {
	if !s.progress && event.GetProgress() != nil {
		return false
	}
	s.event = event
	if end := event.GetTurnEnd(); end != nil {
		s.end = end
	}
	return true
}

// Event is the event Next received; nil after the stream ended.
func (s *Stream) Event() *turnwirev1.TurnEvent {
	return s.event
}

// End is the turn's TurnEnd once it was received, else nil (the stream broke
// first, or has not reached it yet).
func (s *Stream) End() *turnwirev1.TurnEnd {
	return s.end
}

// Err is the error that ended the stream: nil after a clean end, else an
// *Error (codes.Canceled after ctx was cancelled or Close was called).
func (s *Stream) Err() error {
	return s.err
}

// Wait receives the rest of the stream and returns its TurnEnd; the error
// is Err, or an error when the stream ended without a TurnEnd.
func (s *Stream) Wait() (*turnwirev1.TurnEnd, error) {
	for s.Next() {
	}
	if s.err != nil {
		return s.end, s.err
	}
	if s.end == nil {
		return nil, errors.New("turnwire: the stream ended without a TurnEnd")
	}
	return s.end, nil
}

// Close cancels the call if it still runs; under DISCONNECT_POLICY_CANCEL
// the server then aborts the turn, storing its partial reply. Safe to call
// more than once and after the end.
func (s *Stream) Close() {
	s.cancel()
}
