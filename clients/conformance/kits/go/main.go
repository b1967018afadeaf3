// Command fixture is the kit conformance fixture (clients/conformance/kits/SPEC.md)
// on the Go kit, turnwire.dev/go/kit: the hooks and tools of SPEC.md §2-3,
// written on the kit's public API, journaling what they see (§4).
//
//	fixture --port N --journal PATH
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/big"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/kit"
)

const (
	sleepLimit = 30 * time.Second // a "sleep" hook waits this long at most (the sidecar's deadline comes first)
	slowLimit  = 60 * time.Second // the slow tool waits this long at most (the cancellation comes first)
)

// journal is the JSON-lines journal: one whole line per record, written and
// flushed (the file is unbuffered) before the caller goes on.
type journal struct {
	mu   sync.Mutex
	file *os.File
}

var records journal

// write appends {"event": event, members...}; numbers in members are exact
// (json.Number, *big.Int, integers).
func (j *journal) write(event string, members map[string]any) {
	members["event"] = event
	line, err := json.Marshal(members)
	if err != nil {
		log.Fatalf("journal: %v", err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.file.Write(append(line, '\n')); err != nil {
		log.Fatalf("journal: %v", err)
	}
}

// parsed is JSON text as a value with exact numbers; empty text is null.
func parsed(text string) any {
	if text == "" {
		return nil
	}
	value, err := kit.DecodeJSON[any](text)
	if err != nil {
		return text
	}
	return value
}

// controls is the turn's body.fixture (SPEC.md §2).
func controls(turn *turnwirev1.TurnInfo) map[string]any {
	fixture, _ := turn.GetBody().AsMap()["fixture"].(map[string]any)
	return fixture
}

// misbehave sleeps until the call is cancelled or fails, when the turn asks
// hook to.
func misbehave(ctx context.Context, turn *turnwirev1.TurnInfo, hook string) error {
	switch controls(turn)[hook] {
	case "sleep":
		select {
		case <-ctx.Done():
		case <-time.After(sleepLimit):
		}
	case "fail":
		return fmt.Errorf("fixture: %s failed on purpose", hook)
	}
	return nil
}

var hooks = &kit.Hooks{
	// before_step only observes: the sidecar does not wait for it on HookSession.
	Observe: []turnwirev1.Hook{turnwirev1.Hook_HOOK_BEFORE_STEP},
	BeforeTurn: func(ctx context.Context, r *turnwirev1.BeforeTurnRequest) (*turnwirev1.BeforeTurnResponse, error) {
		records.write("before_turn", map[string]any{
			"request_id": r.GetTurn().GetRequestId(), "system": r.GetSystem(), "attempt": r.GetTurn().GetAttempt(),
			"parent_request_id": kit.CallInfo(ctx).ParentRequestID,
		})
		if err := misbehave(ctx, r.GetTurn(), "before_turn"); err != nil || ctx.Err() != nil {
			return nil, err
		}
		if system, ok := controls(r.GetTurn())["system"].(string); ok {
			return &turnwirev1.BeforeTurnResponse{System: &system}, nil
		}
		return nil, nil
	},
	BeforeStep: func(_ context.Context, r *turnwirev1.BeforeStepRequest) (*turnwirev1.BeforeStepResponse, error) {
		records.write("before_step", map[string]any{
			"request_id": r.GetTurn().GetRequestId(), "step_number": r.GetStepNumber(),
		})
		return nil, nil
	},
	BeforeToolCall: func(ctx context.Context, r *turnwirev1.BeforeToolCallRequest) (*turnwirev1.BeforeToolCallResponse, error) {
		call := r.GetCall()
		input, err := kit.DecodeJSON[map[string]any](call.GetInputJson())
		if err != nil {
			return nil, err
		}
		records.write("before_tool_call", map[string]any{
			"request_id": r.GetTurn().GetRequestId(), "tool_call_id": call.GetToolCallId(),
			"tool_name": call.GetToolName(), "input": input,
		})
		if err := misbehave(ctx, r.GetTurn(), "before_tool_call"); err != nil || ctx.Err() != nil {
			return nil, err
		}
		if call.GetToolName() == "echo" && input["text"] == "blocked" {
			return kit.Block(`echo refused: "blocked" is not allowed`), nil
		}
		if call.GetToolName() == "echo" && input["text"] == "secret" {
			input["text"] = "[redacted]"
			return kit.AllowWithInput(input)
		}
		return nil, nil
	},
	AfterToolCall: func(_ context.Context, r *turnwirev1.AfterToolCallRequest) error {
		records.write("after_tool_call", map[string]any{
			"request_id": r.GetTurn().GetRequestId(), "tool_call_id": r.GetCall().GetToolCallId(),
			"tool_name": r.GetCall().GetToolName(), "success": r.GetSuccess(),
			"outcome": strings.TrimPrefix(r.GetOutcome().String(), "TOOL_CALL_OUTCOME_"),
			"output":  parsed(r.GetOutputJson()), "error": r.GetError(),
		})
		return nil
	},
	OnStepFinish: func(_ context.Context, r *turnwirev1.OnStepFinishRequest) error {
		records.write("on_step_finish", map[string]any{
			"request_id": r.GetTurn().GetRequestId(), "step_number": r.GetStep().GetStepNumber(),
			"tool_names": append([]string{}, r.GetStep().GetToolNames()...), "text": r.GetText(),
		})
		return nil
	},
	OnChunks: func(_ context.Context, chunks *kit.Chunks) error {
		kinds := []string{}
		for chunks.Next() {
			for _, event := range chunks.Events() {
				message := event.ProtoReflect()
				kinds = append(kinds, string(message.WhichOneof(message.Descriptor().Oneofs().ByName("event")).Name()))
			}
		}
		if err := chunks.Err(); err != nil {
			return err
		}
		records.write("on_chunks", map[string]any{"request_id": chunks.Turn().GetRequestId(), "kinds": kinds})
		return nil
	},
	OnChatResponse: func(_ context.Context, r *turnwirev1.OnChatResponseRequest) error {
		records.write("on_chat_response", map[string]any{
			"request_id": r.GetTurn().GetRequestId(),
			"outcome":    strings.TrimPrefix(r.GetOutcome().String(), "TURN_OUTCOME_"),
		})
		return nil
	},
}

// started journals a tool call before the tool sends anything.
func started(call *kit.Call) {
	records.write("tool_call", map[string]any{
		"request_id": call.RequestID, "tool_call_id": call.ToolCallID, "tool_name": call.ToolName,
		"idempotency_key": call.IdempotencyKey, "input": parsed(call.InputJSON),
	})
}

type echoInput struct {
	Text   string         `json:"text" description:"What to echo."`
	Big    *big.Int       `json:"big,omitempty" description:"An integer of any size."`
	Nested map[string]any `json:"nested,omitempty"`
}

type streamInput struct {
	Count int `json:"count" description:"How many preliminary results."`
}

type failInput struct {
	Reason string `json:"reason"`
}

// two64 is 2^64: the stream tool's results carry integers beyond 2^53.
var two64 = new(big.Int).Lsh(big.NewInt(1), 64)

var tools = []kit.ToolDefinition{
	kit.Tool[echoInput, map[string]echoInput]{
		Name:        "echo",
		Description: "Returns its input.",
		Run: func(_ context.Context, call *kit.Call, in echoInput) (map[string]echoInput, error) {
			started(call)
			return map[string]echoInput{"echo": in}, nil
		},
	},
	kit.Tool[streamInput, map[string]int]{
		Name:        "stream",
		Description: "Sends count preliminary results, then the final one.",
		Run: func(_ context.Context, call *kit.Call, in streamInput) (map[string]int, error) {
			started(call)
			for i := 1; i <= in.Count; i++ {
				index := big.NewInt(int64(i))
				if err := call.Preliminary(map[string]any{"index": index, "big": new(big.Int).Add(two64, index)}); err != nil {
					return nil, err
				}
			}
			return map[string]int{"done": in.Count}, nil
		},
	},
	kit.Tool[struct{}, map[string]bool]{
		Name:        "slow",
		Description: "Waits until cancelled.",
		Run: func(ctx context.Context, call *kit.Call, _ struct{}) (map[string]bool, error) {
			started(call)
			select {
			case <-ctx.Done():
				records.write("tool_cancelled", map[string]any{
					"request_id": call.RequestID, "tool_call_id": call.ToolCallID, "tool_name": call.ToolName,
				})
				return nil, ctx.Err()
			case <-time.After(slowLimit):
				return map[string]bool{"finished": true}, nil
			}
		},
	},
	kit.Tool[failInput, any]{
		Name:        "fail",
		Description: "Fails with the reason given.",
		Run: func(_ context.Context, call *kit.Call, in failInput) (any, error) {
			started(call)
			return nil, errors.New("fixture tool failed: " + in.Reason)
		},
	},
}

func main() {
	port := flag.Int("port", 0, "the port of 127.0.0.1 to serve on (0: a free one)")
	path := flag.String("journal", "", "the journal file (emptied first)")
	flag.Parse()
	if *path == "" {
		log.Fatal("--journal is required")
	}
	file, err := os.OpenFile(*path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	records.file = file
	server := grpc.NewServer()
	if err := kit.Register(server, hooks, tools...); err != nil {
		log.Fatal(err)
	}
	listener, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", *port))
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		server.Stop() // in-flight calls may be cut (SPEC.md §1)
	}()
	fmt.Printf("turnwire-kit-fixture listening on %s\n", listener.Addr())
	if err := server.Serve(listener); err != nil {
		log.Fatal(err)
	}
}
