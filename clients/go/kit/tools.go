package kit

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/internal/exactjson"
)

// Tool is a tool a tool host serves (docs/tools.md, "Writing a tool host"):
// the model calls it by Name with an In, and Run's Out is the result. The
// input's JSON Schema comes from In (a struct, or a map with string keys: it
// must be a JSON object) and the informational output schema from Out (none
// when Out is an interface), as schemaOf describes: json tags name the
// members, a field is required unless tagged omitempty, a
// `description:"..."` tag describes it.
//
// The input is In as encoding/json reads input_json, with integers exact
// where In's types hold them: int64 / uint64 up to their range, *big.Int
// and json.Number of any size, and json.Number inside any / map[string]any.
// An input that does not decode, or lacks a member the schema requires (or
// sets it to null), is a tool error the model reads (it may correct its call);
// Run is not called.
type Tool[In, Out any] struct {
	// Name is what the model calls: 1-64 of A-Z a-z 0-9 _ -.
	Name string
	// Description tells the model what the tool does.
	Description string
	// RequiresApproval: every call waits for the client's approval
	// (docs/semantics.md §6).
	RequiresApproval bool
	// Timeout bounds one call (the sidecar's deadline, which cancels ctx);
	// zero: the sidecar's tool timeout.
	Timeout time.Duration
	// Idempotent declares that running a call again with the same
	// Call.IdempotencyKey has its effect once: a call that was running when
	// the sidecar died is then run again on recovery (Call.Rerun set);
	// otherwise the model gets the interrupted result (docs/semantics.md §8,
	// "Tool effects").
	Idempotent bool
	// Run runs one call. Its result is encoded as encoding/json does (numbers
	// exact). An error is a tool error whose text (err.Error()) the model reads,
	// and the turn goes on; the call itself ends OK, as the contract asks.
	// ctx is cancelled when the sidecar cancels the call (the turn was
	// cancelled, the deadline passed): stop the work and return; nothing more
	// is sent (CallInfo(ctx) has the call's metadata). call carries the
	// call's ids and sends preliminary results.
	Run func(ctx context.Context, call *Call, input In) (Out, error)
}

// ToolDefinition is a Tool of any input and output types, as Serve and
// Register take them.
type ToolDefinition interface {
	spec() (*turnwirev1.ToolSpec, error)
	execute(ctx context.Context, call *Call) (string, error)
}

var toolName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (t Tool[In, Out]) spec() (*turnwirev1.ToolSpec, error) {
	if !toolName.MatchString(t.Name) {
		return nil, fmt.Errorf("kit: tool name %q: use 1-64 of A-Z a-z 0-9 _ -", t.Name)
	}
	if t.Run == nil {
		return nil, fmt.Errorf("kit: tool %q has no Run", t.Name)
	}
	input, err := schemaOf(reflect.TypeOf((*In)(nil)).Elem())
	if err != nil {
		return nil, fmt.Errorf("kit: tool %q: input: %w", t.Name, err)
	}
	if input["type"] != "object" {
		return nil, fmt.Errorf("kit: tool %q: the input type must be a JSON object (a struct or a map), not %T", t.Name, *new(In))
	}
	spec := &turnwirev1.ToolSpec{Name: t.Name, Description: t.Description, RequiresApproval: t.RequiresApproval, Idempotent: t.Idempotent}
	if spec.InputSchema, err = structpb.NewStruct(input); err != nil {
		return nil, fmt.Errorf("kit: tool %q: input schema: %w", t.Name, err)
	}
	if outType := reflect.TypeOf((*Out)(nil)).Elem(); outType.Kind() != reflect.Interface {
		output, err := schemaOf(outType)
		if err != nil {
			return nil, fmt.Errorf("kit: tool %q: output: %w", t.Name, err)
		}
		if spec.OutputSchema, err = structpb.NewStruct(output); err != nil {
			return nil, fmt.Errorf("kit: tool %q: output schema: %w", t.Name, err)
		}
	}
	if t.Timeout > 0 {
		spec.Timeout = durationpb.New(t.Timeout)
	}
	return spec, nil
}

// toolError is the error of a call whose tool failed: its text goes to the
// model (ExecuteToolResponse.error), apart from a call that could not run
// (an error status).
type toolError struct{ text string }

func (e toolError) Error() string { return e.text }

// execute runs one call: the final output's JSON text, a toolError, or
// another error (the call fails with its status).
func (t Tool[In, Out]) execute(ctx context.Context, call *Call) (string, error) {
	text := call.InputJSON
	if text == "" {
		text = "{}"
	}
	input, err := exactjson.Decode[In](text)
	if err == nil {
		err = t.checkRequired(text)
	}
	if err != nil {
		return "", toolError{fmt.Sprintf("invalid input for tool %q: %v", t.Name, err)}
	}
	// Run's error is the tool's failure; run's own error is a panic or the
	// call's cancellation.
	var failure error
	output, err := run(ctx, "tool "+t.Name, func(ctx context.Context, input In) (Out, error) {
		output, err := t.Run(ctx, call, input)
		failure = err
		return output, nil
	}, input)
	switch {
	case err != nil:
		return "", err
	case failure != nil:
		return "", toolError{failure.Error()}
	}
	encoded, err := exactjson.Encode(output)
	if err != nil {
		return "", toolError{fmt.Sprintf("tool %q returned a value with no JSON form: %v", t.Name, err)}
	}
	return encoded, nil
}

// checkRequired reports the first member In's schema requires that the input
// (valid JSON: it decoded) lacks or sets to null, at any depth; encoding/json
// would leave it the zero value, which the schema told the model it must give.
func (t Tool[In, Out]) checkRequired(text string) error {
	schema, err := schemaOf(reflect.TypeOf((*In)(nil)).Elem())
	if err != nil {
		return err
	}
	value, err := exactjson.Decode[any](text)
	if err != nil {
		return err
	}
	if path, null := missingMember(schema, value, ""); path != "" {
		if null {
			return fmt.Errorf("member %q is required, not null", path)
		}
		return fmt.Errorf("member %q is required", path)
	}
	return nil
}

// Call is one call of a tool (ExecuteToolRequest): its ids and a way to send
// preliminary results.
type Call struct {
	// ConversationID is the conversation; RequestID the turn's request id.
	ConversationID, RequestID string
	// ToolCallID is the call's id within the turn; ToolName the tool.
	ToolCallID, ToolName string
	// StepNumber is the 0-based step that made the call.
	StepNumber int
	// IdempotencyKey is the same for this call on every attempt of its turn,
	// every recovery and every replica (`tw-k-` and 32 hex digits): hand it to
	// what the tool changes so that a call made again has its effect once
	// (docs/tools.md, "Idempotency keys").
	IdempotencyKey string
	// Rerun is true when the call runs again after a crash interrupted it
	// while it ran (the tool is Idempotent): same IdempotencyKey as before.
	Rerun bool
	// InputJSON is the input as the sidecar sent it (compact JSON text).
	InputJSON string

	mu    sync.Mutex
	send  func(*turnwirev1.ExecuteToolResponse) error
	ended bool
}

// errCallEnded: Preliminary after Run returned.
var errCallEnded = errors.New("kit: the tool call has ended")

// Preliminary sends a preliminary result (any value encoding/json encodes,
// numbers exact): the client sees it at once (ToolOutputAvailable with
// preliminary set), the model only sees the final result. Results arrive in
// the order they are sent. It is safe to call from other goroutines while Run
// runs, and fails once Run returned or the call was cancelled (stop then).
func (c *Call) Preliminary(value any) error {
	text, err := exactjson.Encode(value)
	if err != nil {
		return fmt.Errorf("kit: preliminary result: %w", err)
	}
	return c.write(&turnwirev1.ExecuteToolResponse{Result: &turnwirev1.ExecuteToolResponse_PreliminaryOutputJson{PreliminaryOutputJson: text}}, false)
}

// write sends one message of the call's stream (gRPC streams take one Send at
// a time); last ends the call for later Preliminary calls.
func (c *Call) write(message *turnwirev1.ExecuteToolResponse, last bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return errCallEnded
	}
	c.ended = last
	return c.send(message)
}

// end stops later Preliminary calls (Run returned without a final message).
func (c *Call) end() {
	c.mu.Lock()
	c.ended = true
	c.mu.Unlock()
}
