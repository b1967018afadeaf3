package turnwire

import (
	"context"
	"errors"
	"io"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
)

// eventResponse is what every turn-running RPC streams: a message holding one
// TurnEvent (ChatResponse, SaveMessagesResponse, ...).
type eventResponse interface {
	GetEvent() *turnwirev1.TurnEvent
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
	if s.done {
		return false
	}
	response, err := s.recv()
	for err == nil && !s.progress && response.GetEvent().GetProgress() != nil {
		response, err = s.recv()
	}
	if err != nil {
		s.done = true
		s.event = nil
		if !errors.Is(err, io.EOF) {
			s.err = err
		}
		s.cancel() // releases the call's context
		return false
	}
	s.event = response.GetEvent()
	if end := s.event.GetTurnEnd(); end != nil {
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
