package kit_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/internal/sidecar"
	"turnwire.dev/go/kit"
	"turnwire.dev/go/turnwire"
)

// The end-to-end tests: a real `turnwire serve` uses a kit server of this
// process as its remote hook server (on HookSession) and tool host, and
// docs/api/kit-go.md's program as another (on unary RPCs; docs_test.go).
var (
	side     *sidecar.Sidecar
	client   *turnwire.Client
	seen     = &journal{}
	requests string // the scripted model's record_requests file
)

// journal records what the kit's handlers saw, by turn.
type journal struct {
	mu      sync.Mutex
	entries []string // "<request id> <hook> <detail>"
}

func (j *journal) add(requestID, hook, detail string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.entries = append(j.entries, requestID+" "+hook+" "+detail)
}

// of is the entries of one turn, without their request id.
func (j *journal) of(requestID string) []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []string
	for _, entry := range j.entries {
		if rest := strings.TrimPrefix(entry, requestID+" "); rest != entry {
			out = append(out, rest)
		}
	}
	return out
}

// waitUntil polls condition until it holds, failing the test after callTimeout.
func waitUntil(t *testing.T, what string, condition func() bool) {
	t.Helper()
	deadline := time.Now().Add(callTimeout)
	for !condition() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, callTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var (
	slowStarted   = make(chan string, 1)
	slowCancelled = make(chan error, 1)
)

// e2eHooks: BeforeTurn sets the system prompt, BeforeToolCall blocks
// "delete", the observing hooks write the journal.
var e2eHooks = &kit.Hooks{
	BeforeTurn: func(ctx context.Context, r *turnwirev1.BeforeTurnRequest) (*turnwirev1.BeforeTurnResponse, error) {
		seen.add(r.GetTurn().GetRequestId(), "before_turn", "parent "+kit.CallInfo(ctx).ParentRequestID)
		system := "from the Go kit"
		return &turnwirev1.BeforeTurnResponse{System: &system}, nil
	},
	BeforeToolCall: func(_ context.Context, r *turnwirev1.BeforeToolCallRequest) (*turnwirev1.BeforeToolCallResponse, error) {
		seen.add(r.GetTurn().GetRequestId(), "before_tool_call", r.GetCall().GetInputJson())
		if r.GetCall().GetToolName() == "delete" {
			return kit.Block("delete is disabled"), nil
		}
		return nil, nil
	},
	AfterToolCall: func(_ context.Context, r *turnwirev1.AfterToolCallRequest) error {
		seen.add(r.GetTurn().GetRequestId(), "after_tool_call", r.GetOutcome().String()+" "+r.GetOutputJson())
		return nil
	},
	OnChunks: func(_ context.Context, chunks *kit.Chunks) error {
		var kinds []string
		for chunks.Next() {
			for _, event := range chunks.Events() {
				kinds = append(kinds, event.ProtoReflect().WhichOneof(event.ProtoReflect().Descriptor().Oneofs().ByName("event")).TextName())
			}
		}
		seen.add(chunks.Turn().GetRequestId(), "on_chunks", strings.Join(kinds, ","))
		return chunks.Err()
	},
	OnChatResponse: func(_ context.Context, r *turnwirev1.OnChatResponseRequest) error {
		seen.add(r.GetTurn().GetRequestId(), "on_chat_response", r.GetOutcome().String())
		return nil
	},
}

var (
	slow = kit.Tool[struct{}, string]{
		Name:        "slow",
		Description: "Waits until cancelled.",
		Run: func(ctx context.Context, call *kit.Call, _ struct{}) (string, error) {
			slowStarted <- call.RequestID + " parent " + kit.CallInfo(ctx).ParentRequestID
			<-ctx.Done()
			slowCancelled <- ctx.Err()
			return "", ctx.Err()
		},
	}
	deleteTool = kit.Tool[struct{}, string]{
		Name:        "delete",
		Description: "Deletes everything.",
		Run: func(_ context.Context, call *kit.Call, _ struct{}) (string, error) {
			seen.add(call.RequestID, "delete ran", "")
			return "deleted", nil
		},
	}
)

var scripts = map[string]any{
	"kit-add": []any{
		map[string]any{"tool_calls": []any{map[string]any{
			"name": "add", "raw_input": `{"a":123456789012345678901234567890,"b":-18446744073709551617}`,
		}}},
		map[string]any{"text": "Done."},
	},
	"kit-count": []any{
		map[string]any{"tool_calls": []any{map[string]any{"name": "count", "input": map[string]any{"to": 4}}}},
		map[string]any{"text": "Done."},
	},
	"kit-delete": []any{
		map[string]any{"tool_calls": []any{map[string]any{"name": "delete"}}},
		map[string]any{"text": "Done."},
	},
	"kit-docs-stock": []any{
		map[string]any{"tool_calls": []any{map[string]any{"name": "lookup_stock", "input": map[string]any{"sku": "A-1"}}}},
		map[string]any{"text": "Done."},
	},
	"kit-docs-internal": []any{
		map[string]any{"tool_calls": []any{map[string]any{"name": "lookup_stock", "input": map[string]any{"sku": "internal-9"}}}},
		map[string]any{"text": "Done."},
	},
	"kit-slow": []any{
		map[string]any{"tool_calls": []any{map[string]any{"name": "slow"}}},
		map[string]any{"text": "Done."},
	},
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	server := grpc.NewServer()
	if err := kit.Register(server, e2eHooks, add, count, slow, deleteTool); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go server.Serve(listener) //nolint:errcheck // ends with Stop
	defer server.Stop()
	dir, err := os.MkdirTemp("", "turnwire-kit-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	requests = filepath.Join(dir, "requests.jsonl")
	address := listener.Addr().String()
	docs, stopDocs, err := startDocsProgram(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stopDocs()
	config := map[string]any{
		"middleware": []any{
			map[string]any{"remote": map[string]any{
				"address": address, "deadline_seconds": 5, "hook_session": true,
				"failure_mode": map[string]any{"default": "closed"},
			}},
			// docs/api/kit-go.md's program, on unary RPCs.
			map[string]any{"remote": map[string]any{
				"address": docs, "hook_session": false, "failure_mode": map[string]any{"before_tool_call": "closed"},
			}},
		},
		"tools": map[string]any{"demo": false, "hosts": []any{
			map[string]any{"name": "kit", "address": address}, map[string]any{"name": "docs", "address": docs},
		}},
		"providers": map[string]any{"scripted": map[string]any{
			"scripts": scripts, "strict": true, "record_requests": requests,
		}},
	}
	return sidecar.RunTests(m, config, func(s *sidecar.Sidecar, c *turnwire.Client) { side, client = s, c })
}

// chat runs a turn of scripted:<script> to its end and returns its events.
func chat(t *testing.T, requestID, script string) []*turnwirev1.TurnEvent {
	t.Helper()
	model := "scripted:" + script
	stream, err := client.Chat(testContext(t), &turnwirev1.ChatRequest{
		ConversationId: requestID, RequestId: requestID, Model: model, Message: turnwire.UserText("go"),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var events []*turnwirev1.TurnEvent
	for stream.Next() {
		events = append(events, stream.Event())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("chat: %v\n%s", err, side.Log())
	}
	if status := stream.End().GetStatus(); status != turnwirev1.TurnStatus_TURN_STATUS_COMPLETED {
		t.Fatalf("turn %s: %v\n%s", requestID, stream.End(), side.Log())
	}
	return events
}

// outputs are the ToolOutputAvailable events' output_json, "(preliminary)"
// marking preliminary ones, and ToolOutputDenied reasons as "denied: ...".
func outputs(events []*turnwirev1.TurnEvent) []string {
	var out []string
	for _, event := range events {
		if o := event.GetToolOutputAvailable(); o != nil {
			text := o.GetOutputJson()
			if o.GetPreliminary() {
				text += " (preliminary)"
			}
			if o.GetDecision() != turnwirev1.ToolCallDecision_TOOL_CALL_DECISION_UNSPECIFIED {
				text += " " + o.GetDecision().String()
			}
			out = append(out, text)
		}
		if e := event.GetToolOutputError(); e != nil {
			out = append(out, "error: "+e.GetErrorText())
		}
	}
	return out
}

func TestSidecarRunsAKitToolWithExactIntegersAndCallsTheHooks(t *testing.T) {
	events := chat(t, "kit-add-1", "kit-add")
	want := []string{`{"sum":123456788993898934827525016273}`}
	if got := outputs(events); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("tool outputs %v; want %v", got, want)
	}
	waitUntil(t, "on_chat_response", func() bool { return len(seen.of("kit-add-1")) == 5 })
	got := seen.of("kit-add-1")
	// OnChunks' batches may arrive after later unary hooks (hooks.proto): its
	// entry is checked apart from the others' order.
	var ordered []string
	var chunks string
	for _, entry := range got {
		if strings.HasPrefix(entry, "on_chunks ") {
			chunks = entry
		} else {
			ordered = append(ordered, entry)
		}
	}
	wantOrdered := []string{
		"before_turn parent kit-add-1",
		`before_tool_call {"a":123456789012345678901234567890,"b":-18446744073709551617}`,
		`after_tool_call TOOL_CALL_OUTCOME_EXECUTED {"sum":123456788993898934827525016273}`,
		"on_chat_response TURN_OUTCOME_COMPLETED",
	}
	if strings.Join(ordered, "\n") != strings.Join(wantOrdered, "\n") {
		t.Errorf("hooks saw\n%s\nwant\n%s", strings.Join(ordered, "\n"), strings.Join(wantOrdered, "\n"))
	}
	for _, kind := range []string{"tool_input_available", "tool_output_available", "text_delta"} {
		if !strings.Contains(chunks, kind) {
			t.Errorf("on_chunks saw %q; want a %s", chunks, kind)
		}
	}
	// BeforeTurn's system prompt is what the model was sent, with the line
	// the docs program's BeforeTurn, next in the chain, added to it.
	systems := systemPrompts(t, "kit-add")
	const system = "from the Go kit\nAnswer in English."
	if len(systems) != 2 || systems[0] != system || systems[1] != system {
		t.Errorf("the model's system prompts %q; want BeforeTurn's on both steps", systems)
	}
}

// systemPrompts are the system prompts the scripted model was sent for
// scripted:<script> (recorded as <script>), step by step, turn after turn
// (its record_requests file).
func systemPrompts(t *testing.T, script string) []string {
	t.Helper()
	file, err := os.Open(requests)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	var systems []string
	for scanner := bufio.NewScanner(file); scanner.Scan(); {
		var request struct {
			Model  string `json:"model"`
			System string `json:"system"`
		}
		if err := json.Unmarshal(scanner.Bytes(), &request); err != nil {
			t.Fatal(err)
		}
		if request.Model == script {
			systems = append(systems, request.System)
		}
	}
	return systems
}

func TestSidecarStreamsAKitToolsPreliminaryResults(t *testing.T) {
	got := outputs(chat(t, "kit-count-1", "kit-count"))
	// Once preliminary results came, the final value is also sent once as
	// preliminary, then as final (docs/tools.md).
	want := []string{
		`{"i":1} (preliminary)`, `{"i":2} (preliminary)`, `{"i":3} (preliminary)`,
		`{"done":4} (preliminary)`, `{"done":4}`,
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("tool outputs\n%v\nwant\n%v", got, want)
	}
}

func TestSidecarAppliesAKitHooksBlock(t *testing.T) {
	got := outputs(chat(t, "kit-delete-1", "kit-delete"))
	if len(got) != 1 || !strings.Contains(got[0], "delete is disabled") || !strings.HasSuffix(got[0], "TOOL_CALL_DECISION_BLOCKED") {
		t.Fatalf("tool outputs %v; want the block", got)
	}
	waitUntil(t, "on_chat_response", func() bool {
		entries := seen.of("kit-delete-1")
		return len(entries) > 0 && strings.HasPrefix(entries[len(entries)-1], "on_chat_response")
	})
	for _, entry := range seen.of("kit-delete-1") {
		if entry == "delete ran " {
			t.Fatalf("the blocked tool ran")
		}
		if strings.HasPrefix(entry, "after_tool_call") && !strings.HasPrefix(entry, "after_tool_call TOOL_CALL_OUTCOME_BLOCKED") {
			t.Errorf("after_tool_call saw %q; want BLOCKED", entry)
		}
	}
}

func TestCancellingTheTurnCancelsTheKitTool(t *testing.T) {
	ctx := testContext(t)
	model := "scripted:kit-slow"
	stream, err := client.Chat(ctx, &turnwirev1.ChatRequest{
		ConversationId: "kit-slow-1", RequestId: "kit-slow-1", Model: model, Message: turnwire.UserText("go"),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if id := wait(t, slowStarted, "the slow tool's start"); id != "kit-slow-1 parent kit-slow-1" {
		t.Fatalf("the slow tool ran for %q", id)
	}
	if _, err := client.Service().CancelChat(ctx, &turnwirev1.CancelChatRequest{RequestId: "kit-slow-1"}); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, slowCancelled, "the slow tool's cancellation"); !errors.Is(err, context.Canceled) {
		t.Errorf("the tool's context ended with %v; want context.Canceled", err)
	}
	end, err := stream.Wait()
	if err != nil || end.GetStatus() != turnwirev1.TurnStatus_TURN_STATUS_ABORTED {
		t.Fatalf("turn end %v, %v; want ABORTED", end, err)
	}
}
