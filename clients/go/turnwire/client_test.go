package turnwire_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/internal/sidecar"
	"turnwire.dev/go/turnwire"
)

// callTimeout bounds every call of a test; a turn of the scripted model takes
// milliseconds.
const callTimeout = 20 * time.Second

// The sidecar every test talks to: the embedded defaults (scripted:demo, the
// demo tools), a slow script to cancel, a silent one, and a queue of one turn
// per conversation so a second turn is refused with RetryInfo.
var (
	server *sidecar.Sidecar
	client *turnwire.Client
)

var config = map[string]any{
	"providers": map[string]any{"scripted": map[string]any{"scripts": map[string]any{
		// One character every 50 ms, again and again: it never ends on its own, so
		// every test that starts it ends it (a cancel, a close, an interrupt).
		"slow": []any{map[string]any{
			"text": strings.Repeat("slow ", 40), "chunk_size": 1, "delay_ms": 50, "until_cancelled": true,
		}},
		// One word after 2.5 s of silence: Progress keepalives every 0.5 s (progress_test.go).
		"silent": []any{map[string]any{"text": "late", "delay_ms": 2500}},
		// A provider failure that a retry may get past (retry_test.go).
		"down": []any{map[string]any{"error": map[string]any{"message": "overloaded", "status": 529}}},
		// A call of a tool that waits for approval, then a reply (approval_test.go).
		"ask-time": []any{map[string]any{"tool_calls": []any{map[string]any{
			"name": "get_current_time", "input": map[string]any{"timezone": "UTC"},
		}}}},
		"done": []any{map[string]any{"text": "Done."}},
	}}},
	"tools":  map[string]any{"demo": true, "require_approval": []any{"get_current_time"}},
	"limits": map[string]any{"max_queued_turns_per_conversation": 1, "progress_interval_seconds": 0.5},
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	return sidecar.RunTests(m, config, func(s *sidecar.Sidecar, c *turnwire.Client) { server, client = s, c })
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// collect runs stream to its end and returns its events.
func collect(t *testing.T, stream *turnwire.Stream) []*turnwirev1.TurnEvent {
	t.Helper()
	defer stream.Close()
	var events []*turnwirev1.TurnEvent
	for stream.Next() {
		events = append(events, stream.Event())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v\n%s", err, server.Log())
	}
	return events
}

func TestChatCallsATool(t *testing.T) {
	ctx := testContext(t)
	conversation := "go-tool-call"
	stream, err := client.Chat(ctx, &turnwirev1.ChatRequest{
		ConversationId: conversation,
		Message:        turnwire.UserText("What's the weather in Paris?"),
	})
	if err != nil {
		t.Fatal(err)
	}
	events := collect(t, stream)

	var input map[string]any
	var output any
	var text strings.Builder
	for i, event := range events {
		if event.GetSequenceNumber() != int64(i+1) {
			t.Fatalf("event %d has sequence number %d; want 1..N without gaps", i, event.GetSequenceNumber())
		}
		switch e := event.GetEvent().(type) {
		case *turnwirev1.TurnEvent_TextDelta:
			text.WriteString(e.TextDelta.GetDelta())
		case *turnwirev1.TurnEvent_ToolInputAvailable:
			if e.ToolInputAvailable.GetToolName() != "get_weather" {
				t.Errorf("tool %q called; want get_weather", e.ToolInputAvailable.GetToolName())
			}
			if input, err = turnwire.ToolInput(e.ToolInputAvailable); err != nil {
				t.Fatal(err)
			}
		case *turnwirev1.TurnEvent_ToolOutputAvailable:
			if output, err = turnwire.ToolOutput(e.ToolOutputAvailable); err != nil {
				t.Fatal(err)
			}
		}
	}
	if want := map[string]any{"city": "Paris"}; !reflect.DeepEqual(input, want) {
		t.Errorf("tool input %#v; want %#v", input, want)
	}
	weather, ok := output.(map[string]any)
	if !ok || weather["city"] != "Paris" || weather["source"] != "offline demo data" {
		t.Fatalf("tool output %#v; want the demo weather of Paris", output)
	}
	// Numbers decode as json.Number, exactly as the tool returned them.
	if _, err := weather["temperature_c"].(json.Number).Int64(); err != nil {
		t.Errorf("temperature_c %#v is not an integer json.Number", weather["temperature_c"])
	}
	if !strings.Contains(text.String(), "Paris") {
		t.Errorf("the answer %q does not mention Paris", text.String())
	}

	end := stream.End()
	if end == nil || end != events[len(events)-1].GetTurnEnd() {
		t.Fatalf("End() is %v; want the last event's TurnEnd", end)
	}
	if end.GetStatus() != turnwirev1.TurnStatus_TURN_STATUS_COMPLETED || end.GetStepCount() != 2 {
		t.Errorf("turn ended %v after %d steps; want COMPLETED after 2", end.GetStatus(), end.GetStepCount())
	}
	if turnwire.FromStatus(end.GetError()) != nil {
		t.Errorf("a completed turn has error %v", end.GetError())
	}

	// The stored assistant message holds the call with the same values.
	stored, err := client.Service().GetConversation(ctx, &turnwirev1.GetConversationRequest{ConversationId: conversation})
	if err != nil {
		t.Fatal(err)
	}
	messages := stored.GetConversation().GetMessages()
	var call *turnwirev1.ToolCallPart
	for _, part := range messages[len(messages)-1].GetParts() {
		if c := part.GetToolCall(); c != nil {
			call = c
		}
	}
	if call == nil {
		t.Fatalf("the stored reply has no tool call: %v", messages[len(messages)-1])
	}
	if got, _ := turnwire.ToolInput(call); !reflect.DeepEqual(got, input) {
		t.Errorf("stored input %#v; want %#v", got, input)
	}
	if got, _ := turnwire.ToolOutput(call); !reflect.DeepEqual(got, output) {
		t.Errorf("stored output %#v; want %#v", got, output)
	}
}

func TestToolValuesKeepExactNumbers(t *testing.T) {
	ctx := testContext(t)
	stream, err := client.Chat(ctx, &turnwirev1.ChatRequest{
		ConversationId: "go-exact-numbers",
		Message:        turnwire.UserText("Calculate 12345678901234567 * 1000"),
	})
	if err != nil {
		t.Fatal(err)
	}
	var output any
	for _, event := range collect(t, stream) {
		if e := event.GetToolOutputAvailable(); e != nil {
			if output, err = turnwire.ToolOutput(e); err != nil {
				t.Fatal(err)
			}
		}
	}
	result, _ := output.(map[string]any)
	// 12345678901234567000 is above 2^63 and not a float64: only exact decoding keeps it.
	if got := result["result"]; got != json.Number("12345678901234567000") {
		t.Errorf("calculator result %#v; want json.Number 12345678901234567000", got)
	}
}

// startSlowTurn starts a turn of the slow script and reads until its first
// text delta, so the turn runs.
func startSlowTurn(t *testing.T, ctx context.Context, conversation, requestID string) *turnwire.Stream {
	t.Helper()
	stream, err := client.Chat(ctx, &turnwirev1.ChatRequest{
		ConversationId: conversation,
		RequestId:      requestID,
		Message:        turnwire.UserText("Take your time."),
		Model:          "scripted:slow",
	})
	if err != nil {
		t.Fatal(err)
	}
	for stream.Next() {
		if stream.Event().GetTextDelta() != nil {
			return stream
		}
	}
	t.Fatalf("the slow turn ended before its first text delta: %v, %v", stream.Err(), stream.End())
	return nil
}

// abortedEnd re-attaches to the turn requestID and returns its TurnEnd.
func abortedEnd(t *testing.T, requestID string) *turnwirev1.TurnEnd {
	t.Helper()
	resumed, err := client.ResumeTurn(testContext(t), &turnwirev1.ResumeTurnRequest{RequestId: requestID})
	if err != nil {
		t.Fatal(err)
	}
	end, err := resumed.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return end
}

func TestCancellingTheContextCancelsTheTurn(t *testing.T) {
	ctx, cancel := context.WithCancel(testContext(t))
	stream := startSlowTurn(t, ctx, "go-cancel-context", "go-cancel-context-1")
	cancel()
	for stream.Next() {
	}
	err := stream.Err()
	var turnwireErr *turnwire.Error
	if !errors.As(err, &turnwireErr) || turnwireErr.Code != codes.Canceled || !errors.Is(err, context.Canceled) {
		t.Fatalf("stream error %#v; want an *Error with codes.Canceled that Is context.Canceled", err)
	}
	if stream.End() != nil {
		t.Errorf("a cancelled stream has a TurnEnd: %v", stream.End())
	}
	// The server ends the turn ABORTED (DISCONNECT_POLICY_CANCEL, the default).
	if end := abortedEnd(t, "go-cancel-context-1"); end.GetStatus() != turnwirev1.TurnStatus_TURN_STATUS_ABORTED {
		t.Errorf("the turn ended %v; want TURN_STATUS_ABORTED", end.GetStatus())
	}
}

func TestClosingTheStreamCancelsTheTurn(t *testing.T) {
	stream := startSlowTurn(t, testContext(t), "go-cancel-close", "go-cancel-close-1")
	stream.Close()
	for stream.Next() {
	}
	if !errors.Is(stream.Err(), context.Canceled) {
		t.Fatalf("stream error %v; want codes.Canceled", stream.Err())
	}
	if end := abortedEnd(t, "go-cancel-close-1"); end.GetStatus() != turnwirev1.TurnStatus_TURN_STATUS_ABORTED {
		t.Errorf("the turn ended %v; want TURN_STATUS_ABORTED", end.GetStatus())
	}
}

func TestInvalidConversationIdIsAFieldViolation(t *testing.T) {
	stream, err := client.Chat(testContext(t), &turnwirev1.ChatRequest{
		ConversationId: "not a valid id!",
		Message:        turnwire.UserText("hello"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if stream.Next() {
		t.Fatalf("an invalid request streamed %v", stream.Event())
	}
	var e *turnwire.Error
	if !errors.As(stream.Err(), &e) {
		t.Fatalf("stream error %#v; want an *Error", stream.Err())
	}
	if e.Code != codes.InvalidArgument || e.Reason != "INVALID_FIELD" || e.Domain != turnwire.Domain {
		t.Errorf("got %v [%s, %s]; want InvalidArgument [INVALID_FIELD, turnwire.dev]", e.Code, e.Reason, e.Domain)
	}
	if e.ErrorReason() != turnwirev1.ErrorReason_ERROR_REASON_INVALID_FIELD {
		t.Errorf("ErrorReason() %v; want ERROR_REASON_INVALID_FIELD", e.ErrorReason())
	}
	if len(e.FieldViolations) != 1 || e.FieldViolations[0].Field != "conversation_id" || e.FieldViolations[0].Description == "" {
		t.Errorf("field violations %+v; want one, of conversation_id", e.FieldViolations)
	}
	// gRPC-Go's own helpers see the status through GRPCStatus.
	if status.Code(stream.Err()) != codes.InvalidArgument {
		t.Errorf("status.Code %v; want InvalidArgument", status.Code(stream.Err()))
	}
}

func TestDialFailsAtOnceWhenNothingListens(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := listener.Addr().String()
	listener.Close()
	started := time.Now()
	c, err := turnwire.Dial(testContext(t), addr, grpc.WithInsecure())
	if err == nil {
		c.Close()
		t.Fatalf("Dial of %s, where nothing listens, succeeded", addr)
	}
	if !strings.Contains(err.Error(), "connection refused") || time.Since(started) > callTimeout/2 {
		t.Errorf("Dial of %s: %v after %s; want connection refused at once", addr, err, time.Since(started))
	}
}

func TestUnaryCallsReturnError(t *testing.T) {
	_, err := client.Service().GetConversation(testContext(t), &turnwirev1.GetConversationRequest{ConversationId: "go-never-used"})
	var e *turnwire.Error
	if !errors.As(err, &e) || e.Code != codes.NotFound ||
		e.ErrorReason() != turnwirev1.ErrorReason_ERROR_REASON_CONVERSATION_NOT_FOUND {
		t.Fatalf("GetConversation of an unknown conversation: %#v; want NotFound [CONVERSATION_NOT_FOUND]", err)
	}
}

func TestOverloadCarriesRetryDelay(t *testing.T) {
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel() // ends the queued turn and the running one
	running := startSlowTurn(t, ctx, "go-overload", "go-overload-1")
	defer running.Close()
	// Two more turns on the conversation: one waits in the queue (its limit
	// is one), the other is refused, whichever arrives second.
	refused := make(chan error, 2)
	for _, text := range []string{"me too", "and me"} {
		stream, err := client.Chat(ctx, &turnwirev1.ChatRequest{ConversationId: "go-overload", Message: turnwire.UserText(text)})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			_, err := stream.Wait()
			refused <- err
		}()
	}
	err := <-refused
	var e *turnwire.Error
	if !errors.As(err, &e) || e.Code != codes.ResourceExhausted || e.Reason != "OVERLOADED" {
		t.Fatalf("a turn past the queue limit: %#v; want ResourceExhausted [OVERLOADED]", err)
	}
	if e.RetryDelay != time.Second || e.Metadata["limit"] != "1" {
		t.Errorf("retry delay %v, metadata %v; want 1s and limit 1", e.RetryDelay, e.Metadata)
	}
}

// TestConcurrentInputStrategy passes ConcurrentInputStrategy through: REJECT
// on a busy conversation is FailedPrecondition [TURN_IN_PROGRESS] naming the
// running turn; INTERRUPT stops it (ABORTED, reason INTERRUPTED) and runs.
func TestConcurrentInputStrategy(t *testing.T) {
	ctx := testContext(t)
	running := startSlowTurn(t, ctx, "go-busy", "go-busy-1")
	defer running.Close()
	rejected, err := client.Chat(ctx, &turnwirev1.ChatRequest{
		ConversationId:          "go-busy",
		Message:                 turnwire.UserText("now"),
		ConcurrentInputStrategy: turnwirev1.ConcurrentInputStrategy_CONCURRENT_INPUT_STRATEGY_REJECT,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = rejected.Wait()
	var e *turnwire.Error
	if !errors.As(err, &e) || e.Code != codes.FailedPrecondition ||
		e.ErrorReason() != turnwirev1.ErrorReason_ERROR_REASON_TURN_IN_PROGRESS {
		t.Fatalf("REJECT on a busy conversation: %#v; want FailedPrecondition [TURN_IN_PROGRESS]", err)
	}
	if e.Metadata["running_request_id"] != "go-busy-1" {
		t.Errorf("metadata %v; want running_request_id go-busy-1", e.Metadata)
	}
	interrupter, err := client.Chat(ctx, &turnwirev1.ChatRequest{
		ConversationId:          "go-busy",
		Message:                 turnwire.UserText("instead"),
		ConcurrentInputStrategy: turnwirev1.ConcurrentInputStrategy_CONCURRENT_INPUT_STRATEGY_INTERRUPT,
	})
	if err != nil {
		t.Fatal(err)
	}
	end, err := running.Wait()
	if err != nil {
		t.Fatal(err)
	}
	stopped := turnwire.FromStatus(end.GetError())
	if end.GetStatus() != turnwirev1.TurnStatus_TURN_STATUS_ABORTED ||
		stopped.ErrorReason() != turnwirev1.ErrorReason_ERROR_REASON_INTERRUPTED {
		t.Fatalf("the interrupted turn ended %v %v; want ABORTED [INTERRUPTED]", end.GetStatus(), stopped)
	}
	if next, err := interrupter.Wait(); err != nil || next.GetStatus() != turnwirev1.TurnStatus_TURN_STATUS_COMPLETED {
		t.Fatalf("the interrupting turn: %v, %v; want COMPLETED", next, err)
	}
}
