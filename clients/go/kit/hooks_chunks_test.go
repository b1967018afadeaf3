package kit_test

import (
	"context"
	"errors"
	"io"
	"log"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/internal/sidecar"
	"turnwire.dev/go/kit"
)

// OnChunks batches on HookSession (hooks.proto, HookSessionRequest and
// OnChunksRequest.last).

// session is a test's HookSession stream, its answers received as they come.
type session struct {
	t      *testing.T
	client turnwirev1.TurnHooksServiceClient
	stream turnwirev1.TurnHooksService_HookSessionClient
	cancel context.CancelFunc
	answer chan *turnwirev1.HookAnswer
	ended  chan error // the stream's end: nil at its normal end
}

func openSession(t *testing.T, hooks *kit.Hooks, md ...string) *session {
	t.Helper()
	client := turnwirev1.NewTurnHooksServiceClient(serve(t, hooks))
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(testContext(t), md...))
	t.Cleanup(cancel)
	stream, err := client.HookSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := &session{t: t, client: client, stream: stream, cancel: cancel, answer: make(chan *turnwirev1.HookAnswer, 64), ended: make(chan error, 1)}
	go func() {
		for {
			response, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				s.ended <- err
				return
			}
			for _, answer := range response.GetAnswers() {
				s.answer <- answer
			}
		}
	}()
	return s
}

func (s *session) send(calls ...*turnwirev1.HookCall) {
	s.t.Helper()
	if err := s.stream.Send(&turnwirev1.HookSessionRequest{Calls: calls}); err != nil {
		s.t.Fatal(err)
	}
}

// next is the next answer, which must answer call id.
func (s *session) next(id uint64) *turnwirev1.HookAnswer {
	s.t.Helper()
	answer := wait(s.t, s.answer, "answer to call "+strconv.FormatUint(id, 10))
	if answer.GetId() != id {
		s.t.Fatalf("answer %v; want the answer to call %d", answer, id)
	}
	return answer
}

func textDelta(text string) *turnwirev1.TurnEvent {
	return &turnwirev1.TurnEvent{Event: &turnwirev1.TurnEvent_TextDelta{TextDelta: &turnwirev1.TextDelta{Delta: text}}}
}

// batchCall is an OnChunks batch of turn parent, its events text deltas.
func batchCall(id uint64, parent string, last bool, texts ...string) *turnwirev1.HookCall {
	batch := &turnwirev1.OnChunksRequest{Last: last}
	for _, text := range texts {
		batch.Events = append(batch.Events, textDelta(text))
	}
	return &turnwirev1.HookCall{Id: id, ParentRequestId: parent, Hook: &turnwirev1.HookCall_OnChunks{OnChunks: batch}}
}

// firstBatch is batchCall carrying the turn, as the sidecar's first batch of a turn does.
func firstBatch(id uint64, parent string, last bool, texts ...string) *turnwirev1.HookCall {
	call := batchCall(id, parent, last, texts...)
	call.GetOnChunks().Turn = &turnwirev1.TurnInfo{RequestId: parent}
	return call
}

func beforeTurnCall(id uint64, parent string) *turnwirev1.HookCall {
	return &turnwirev1.HookCall{Id: id, ParentRequestId: parent, Hook: &turnwirev1.HookCall_BeforeTurn{BeforeTurn: &turnwirev1.BeforeTurnRequest{}}}
}

func okAnswer(t *testing.T, answer *turnwirev1.HookAnswer) {
	t.Helper()
	if answer.GetError() != nil || answer.GetHook() == nil {
		t.Fatalf("answer %v; want a response", answer)
	}
}

func deltas(chunks *kit.Chunks) []string {
	var out []string
	for chunks.Next() {
		for _, event := range chunks.Events() {
			out = append(out, event.GetTextDelta().GetDelta())
		}
	}
	return out
}

// chunksRun is what a session's OnChunks handler saw.
type chunksRun struct {
	parent, traceparent, turn string
	deltas                    []string
	err                       error
}

// gate holds a test's handler until the test opens it; open it also at the
// test's end (t.Cleanup after the server's), so that a failed test leaves no
// handler waiting, which would keep its server from stopping.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate() *gate  { return &gate{ch: make(chan struct{})} }
func (g *gate) wait() { <-g.ch }
func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

func TestHookSessionFeedsATurnsBatchesToOneOnChunksHandler(t *testing.T) {
	release, finish := newGate(), newGate()
	read := make(chan chunksRun, 2)
	var returned atomic.Int32
	probed := make(chan int32, 2) // how many OnChunks handlers had returned when a BeforeTurn ran
	hooks := &kit.Hooks{
		BeforeTurn: func(context.Context, *turnwirev1.BeforeTurnRequest) (*turnwirev1.BeforeTurnResponse, error) {
			probed <- returned.Load()
			return nil, nil
		},
		OnChunks: func(ctx context.Context, chunks *kit.Chunks) error {
			defer returned.Add(1)
			release.wait() // blocked: the stream must not wait for it
			info := kit.CallInfo(ctx)
			run := chunksRun{parent: info.ParentRequestID, traceparent: info.TraceContext["traceparent"], turn: chunks.Turn().GetRequestId()}
			run.deltas, run.err = deltas(chunks), chunks.Err()
			read <- run
			finish.wait()
			if run.deltas[len(run.deltas)-1] == "fail" {
				return status.Error(codes.FailedPrecondition, "saw fail")
			}
			return nil
		},
	}
	// The stream's metadata names its first turn; the calls name theirs.
	s := openSession(t, hooks, kit.ParentRequestMetadata, "r-0")
	t.Cleanup(release.open)
	t.Cleanup(finish.open)
	traceparent := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	first := firstBatch(1, "r-1", false, "a", "b")
	first.TraceContext = map[string]string{"traceparent": traceparent}

	// Batches and other calls are answered while the handler has read nothing.
	s.send(first)
	if answer := s.next(1); answer.GetOnChunks() == nil || answer.GetError() != nil {
		t.Fatalf("the first batch: %v; want an on_chunks answer", answer)
	}
	s.send(beforeTurnCall(2, "r-1"))
	okAnswer(t, s.next(2))
	wait(t, probed, "BeforeTurn")
	s.send(batchCall(3, "r-1", false, "c"))
	okAnswer(t, s.next(3))

	// The last batch is answered once the handler returned, and the call
	// after it is handled after that.
	s.send(batchCall(4, "r-1", true, "d"), beforeTurnCall(5, "r-1"))
	release.open()
	run := wait(t, read, "the handler's input end")
	want := chunksRun{parent: "r-1", traceparent: traceparent, turn: "r-1", deltas: []string{"a", "b", "c", "d"}}
	if !reflect.DeepEqual(run, want) {
		t.Fatalf("the handler saw %+v; want %+v", run, want)
	}
	select {
	case answer := <-s.answer:
		t.Fatalf("answer %v while the handler has not returned", answer)
	default:
	}
	finish.open()
	answer := s.next(4)
	if answer.GetOnChunks() == nil || returned.Load() != 1 {
		t.Fatalf("the last batch: %v (handlers returned: %d); want an on_chunks answer after the handler's return", answer, returned.Load())
	}
	okAnswer(t, s.next(5))
	if n := wait(t, probed, "BeforeTurn"); n != 1 {
		t.Fatalf("the BeforeTurn after the last batch ran when %d handlers had returned; want 1", n)
	}

	// A batch of the same turn after the last starts a new handler; its
	// error is the last batch's answer, as the OnChunks RPC's status.
	s.send(firstBatch(6, "r-1", false, "x"))
	okAnswer(t, s.next(6))
	s.send(batchCall(7, "r-1", true, "fail"))
	if e := s.next(7).GetError(); codes.Code(e.GetCode()) != codes.FailedPrecondition || e.GetMessage() != "saw fail" {
		t.Fatalf("the failing handler's last batch: error %v; want FailedPrecondition", e)
	}
	if run := wait(t, read, "the second handler's input end"); !reflect.DeepEqual(run.deltas, []string{"x", "fail"}) {
		t.Fatalf("the second handler saw %v; want [x fail]", run.deltas)
	}
	if returned.Load() != 2 {
		t.Fatalf("%d handlers returned; want 2", returned.Load())
	}
}

func TestHookSessionAnswersUnimplementedOnChunks(t *testing.T) {
	s := openSession(t, &kit.Hooks{BeforeTurn: func(context.Context, *turnwirev1.BeforeTurnRequest) (*turnwirev1.BeforeTurnResponse, error) {
		return nil, nil
	}})
	s.send(firstBatch(1, "r-1", false, "a"), batchCall(2, "r-1", true), beforeTurnCall(3, "r-1"))
	for id := uint64(1); id <= 2; id++ {
		answer := s.next(id)
		if e := answer.GetError(); codes.Code(e.GetCode()) != codes.Unimplemented || e.GetMessage() != "kit: this server does not implement OnChunks" || answer.GetHook() != nil {
			t.Fatalf("a batch with no OnChunks handler: %v; want an Unimplemented error answer", answer)
		}
	}
	okAnswer(t, s.next(3))
}

// captureLog sends the log to a buffer until the test ends.
func captureLog(t *testing.T) *sidecar.LockedBuffer {
	logged := &sidecar.LockedBuffer{}
	previous := log.Writer()
	log.SetOutput(logged)
	t.Cleanup(func() { log.SetOutput(previous) })
	return logged
}

func TestHookSessionDropsOnChunksEventsPastTheBound(t *testing.T) {
	logged := captureLog(t)
	release := newGate()
	read := make(chan []string, 1)
	s := openSession(t, &kit.Hooks{OnChunks: func(_ context.Context, chunks *kit.Chunks) error {
		release.wait()
		read <- deltas(chunks)
		return chunks.Err()
	}})
	t.Cleanup(release.open)
	texts := func(from, to int) []string {
		var out []string
		for i := from; i < to; i++ {
			out = append(out, strconv.Itoa(i))
		}
		return out
	}
	// 6010 events while the handler reads none: the first 4096 wait, the
	// rest are dropped, and every batch is answered.
	s.send(firstBatch(1, "r-big", false, texts(0, 2000)...))
	s.send(batchCall(2, "r-big", false, texts(2000, 4000)...))
	s.send(batchCall(3, "r-big", false, texts(4000, 6000)...))
	s.send(batchCall(4, "r-big", false, texts(6000, 6010)...))
	for id := uint64(1); id <= 4; id++ {
		okAnswer(t, s.next(id))
	}
	s.send(batchCall(5, "r-big", true))
	release.open()
	if got := wait(t, read, "the handler's input"); !reflect.DeepEqual(got, texts(0, 4096)) {
		t.Fatalf("the handler read %d events; want the first 4096, in order", len(got))
	}
	okAnswer(t, s.next(5))
	if n := strings.Count(logged.String(), `OnChunks of turn "r-big" reads too slowly`); n != 1 {
		t.Fatalf("the drops were logged %d times; want once: %q", n, logged.String())
	}
}

func TestHookSessionsEndEndsItsOnChunksHandlers(t *testing.T) {
	for _, end := range []string{"closed", "cancelled"} {
		t.Run(end, func(t *testing.T) {
			started, finish := make(chan struct{}), newGate()
			result := make(chan error, 1)
			var returned atomic.Bool
			s := openSession(t, &kit.Hooks{OnChunks: func(ctx context.Context, chunks *kit.Chunks) error {
				defer returned.Store(true)
				chunks.Next()
				close(started)
				for chunks.Next() { // no last batch: ends with the stream
				}
				result <- chunks.Err()
				finish.wait()
				return chunks.Err()
			}})
			t.Cleanup(finish.open)
			s.send(firstBatch(1, "r-1", false, "a"))
			okAnswer(t, s.next(1))
			wait(t, started, "the handler's first batch")
			if end == "cancelled" {
				s.cancel()
			} else if err := s.stream.CloseSend(); err != nil {
				t.Fatal(err)
			}
			// Its input ends as an OnChunks RPC's does when cancelled.
			if err := wait(t, result, "the handler's input end"); status.Code(err) != codes.Canceled {
				t.Fatalf("the handler's input ended with %v; want Canceled", err)
			}
			if end == "cancelled" {
				finish.open()
				return // the client's own cancellation: it does not wait for the server
			}
			// A stream the sidecar closed ends once its handler has returned,
			// not before: an end sent early would arrive before the answer of
			// this call on the same connection (HTTP/2 keeps the server's
			// frames in order).
			if _, err := s.client.GetHookSubscriptions(testContext(t), &turnwirev1.GetHookSubscriptionsRequest{}); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-s.ended:
				t.Fatalf("the stream ended (%v) while its OnChunks handler runs", err)
			default:
			}
			finish.open()
			if ended := wait(t, s.ended, "the stream's end"); ended != nil || !returned.Load() {
				t.Fatalf("the stream ended with %v, its OnChunks handler returned: %v; want its end after the handler's", ended, returned.Load())
			}
		})
	}
}
