package kit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/big"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/kit"
)

type addInput struct {
	A *big.Int `json:"a" description:"The first addend."`
	B *big.Int `json:"b"`
}

type sum struct {
	Sum *big.Int `json:"sum"`
}

var add = kit.Tool[addInput, sum]{
	Name:        "add",
	Description: "Add two integers exactly.",
	Run: func(_ context.Context, _ *kit.Call, in addInput) (sum, error) {
		if in.A == nil || in.B == nil {
			return sum{}, errors.New("give both a and b")
		}
		return sum{new(big.Int).Add(in.A, in.B)}, nil
	},
}

type countInput struct {
	To int `json:"to"`
}

// count sends {"i": 1} ... {"i": to-1}, half of them from another goroutine
// (Preliminary is safe to call from one), then {"done": to}.
var count = kit.Tool[countInput, map[string]int]{
	Name:        "count",
	Description: "Count up, streaming.",
	Timeout:     1500 * time.Millisecond,
	Run: func(_ context.Context, call *kit.Call, in countInput) (map[string]int, error) {
		for i := 1; i < in.To; i++ {
			done := make(chan error)
			go func(i int) { done <- call.Preliminary(map[string]int{"i": i}) }(i)
			if err := <-done; err != nil {
				return nil, err
			}
		}
		return map[string]int{"done": in.To}, nil
	},
}

type orderLine struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty,omitempty"`
}

type orderInput struct {
	Order struct {
		Lines []orderLine `json:"lines"`
	} `json:"order"`
	Tags map[string]struct {
		Name string `json:"name"`
	} `json:"tags,omitempty"`
}

// order has required members at every depth: in a struct, an array's items
// and a map's values.
var order = kit.Tool[orderInput, map[string]int]{
	Name:        "order",
	Description: "Counts an order's lines.",
	Run: func(_ context.Context, _ *kit.Call, in orderInput) (map[string]int, error) {
		return map[string]int{"lines": len(in.Order.Lines)}, nil
	},
}

var crash = kit.Tool[struct{}, string]{
	Name:             "crash",
	Description:      "Panics.",
	RequiresApproval: true,
	Idempotent:       true,
	Run: func(context.Context, *kit.Call, struct{}) (string, error) {
		panic("a bug in the tool")
	},
}

// execute runs one ExecuteTool call to its end: the messages and the status.
func execute(t *testing.T, client turnwirev1.ToolExecutorServiceClient, request *turnwirev1.ExecuteToolRequest) ([]*turnwirev1.ExecuteToolResponse, error) {
	t.Helper()
	stream, err := client.ExecuteTool(testContext(t), request)
	if err != nil {
		t.Fatal(err)
	}
	var messages []*turnwirev1.ExecuteToolResponse
	for {
		message, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return messages, nil
		}
		if err != nil {
			return messages, err
		}
		messages = append(messages, message)
	}
}

func TestListTools(t *testing.T) {
	client := turnwirev1.NewToolExecutorServiceClient(serve(t, nil, add, count, crash))
	listed, err := client.ListTools(testContext(t), &turnwirev1.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, spec := range listed.GetTools() {
		names = append(names, spec.GetName())
	}
	if want := []string{"add", "count", "crash"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("tools %v; want %v in the order given", names, want)
	}
	addSpec, countSpec, crashSpec := listed.GetTools()[0], listed.GetTools()[1], listed.GetTools()[2]
	wantInput := map[string]any{"type": "object", "required": []any{"a", "b"}, "properties": map[string]any{
		"a": map[string]any{"type": "integer", "description": "The first addend."},
		"b": map[string]any{"type": "integer"},
	}}
	if got := addSpec.GetInputSchema().AsMap(); !reflect.DeepEqual(got, wantInput) {
		t.Errorf("add's input schema %v; want %v", got, wantInput)
	}
	if got := addSpec.GetOutputSchema().AsMap()["required"]; !reflect.DeepEqual(got, []any{"sum"}) {
		t.Errorf("add's output schema %v", addSpec.GetOutputSchema().AsMap())
	}
	if addSpec.GetDescription() != "Add two integers exactly." || addSpec.GetTimeout() != nil || addSpec.GetRequiresApproval() {
		t.Errorf("add: %v", addSpec)
	}
	if addSpec.GetIdempotent() || !crashSpec.GetIdempotent() {
		t.Errorf("add's idempotent %v, crash's %v", addSpec.GetIdempotent(), crashSpec.GetIdempotent())
	}
	if countSpec.GetTimeout().AsDuration() != 1500*time.Millisecond || !crashSpec.GetRequiresApproval() {
		t.Errorf("count's timeout %v, crash's approval %v", countSpec.GetTimeout(), crashSpec.GetRequiresApproval())
	}
	// The instance id is random: another server has another.
	other, err := turnwirev1.NewToolExecutorServiceClient(serve(t, nil, add)).ListTools(testContext(t), &turnwirev1.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(listed.GetInstanceId()) != 32 || other.GetInstanceId() == listed.GetInstanceId() {
		t.Errorf("instance ids %q and %q; want two random ones", listed.GetInstanceId(), other.GetInstanceId())
	}
}

func TestToolResultsKeepBigIntegers(t *testing.T) {
	client := turnwirev1.NewToolExecutorServiceClient(serve(t, nil, add))
	messages, err := execute(t, client, &turnwirev1.ExecuteToolRequest{
		ToolName: "add", InputJson: `{"a":123456789012345678901234567890,"b":-18446744073709551617}`,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(messages) != 1 || messages[0].GetOutputJson() != `{"sum":123456788993898934827525016273}` {
		t.Fatalf("messages %v; want one final result with the exact sum", messages)
	}
}

func TestToolStreamsPreliminaryResultsInOrder(t *testing.T) {
	client := turnwirev1.NewToolExecutorServiceClient(serve(t, nil, count))
	messages, err := execute(t, client, &turnwirev1.ExecuteToolRequest{ToolName: "count", InputJson: `{"to":50}`})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, message := range messages {
		got = append(got, protojson.Format(message))
	}
	var want []string
	for i := 1; i < 50; i++ {
		want = append(want, protojson.Format(&turnwirev1.ExecuteToolResponse{
			Result: &turnwirev1.ExecuteToolResponse_PreliminaryOutputJson{PreliminaryOutputJson: fmt.Sprintf(`{"i":%d}`, i)},
		}))
	}
	want = append(want, protojson.Format(&turnwirev1.ExecuteToolResponse{
		Result: &turnwirev1.ExecuteToolResponse_OutputJson{OutputJson: `{"done":50}`},
	}))
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("messages\n%v\nwant\n%v", got, want)
	}
}

func TestToolFailuresAreToolErrors(t *testing.T) {
	client := turnwirev1.NewToolExecutorServiceClient(serve(t, nil, add, crash, order))
	// Optional members may be left out; a valid input runs.
	messages, err := execute(t, client, &turnwirev1.ExecuteToolRequest{ToolName: "order", InputJson: `{"order":{"lines":[{"sku":"A"}]}}`})
	if err != nil || len(messages) != 1 || messages[0].GetOutputJson() != `{"lines":1}` {
		t.Errorf("order with its required members: %v, %v", messages, err)
	}
	for _, c := range []struct{ tool, input, want string }{
		// A member the schema requires, missing or null (before the kit trial: Run got nil).
		{"add", `{"a":1}`, `invalid input for tool "add": member "b" is required`},
		{"add", `{"a":1,"b":null}`, `invalid input for tool "add": member "b" is required, not null`},
		{"order", `{"order":{"lines":[{"sku":"A"},{"qty":2}]}}`, `invalid input for tool "order": member "order.lines.1.sku" is required`},
		{"order", `{"order":{"lines":[{"sku":"A"}]},"tags":{"x":{}}}`, `invalid input for tool "order": member "tags.x.name" is required`},
		{"add", `{"a":"one"}`, `invalid input for tool "add": math/big: cannot unmarshal "\"one\"" into a *big.Int`},
		{"add", `{"a":1} x`, `invalid input for tool "add": data after the JSON value`},
		{"nope", `{}`, `unknown tool "nope"`},
	} {
		messages, err := execute(t, client, &turnwirev1.ExecuteToolRequest{ToolName: c.tool, InputJson: c.input})
		if err != nil {
			t.Errorf("%s %s: the call failed with %v; want OK", c.tool, c.input, err)
		}
		if len(messages) != 1 || messages[0].GetError() != c.want {
			t.Errorf("%s %s: %v; want the error %q", c.tool, c.input, messages, c.want)
		}
	}
	// A panic fails the call itself (the sidecar makes it a tool error too).
	messages, err = execute(t, client, &turnwirev1.ExecuteToolRequest{ToolName: "crash"})
	if status.Code(err) != codes.Internal || len(messages) != 0 {
		t.Errorf("crash: %v, %v; want Internal and no message", messages, err)
	}
}

func TestACancelledToolCallCancelsItsContext(t *testing.T) {
	started := make(chan *kit.Call, 1)
	ended := make(chan error, 1)
	slow := kit.Tool[struct{}, string]{
		Name:        "slow",
		Description: "Waits until cancelled.",
		Run: func(ctx context.Context, call *kit.Call, _ struct{}) (string, error) {
			if err := call.Preliminary("waiting"); err != nil {
				return "", err
			}
			started <- call
			<-ctx.Done()
			// Nothing more goes out on a cancelled call.
			ended <- call.Preliminary("still here")
			return "finished", nil
		},
	}
	client := turnwirev1.NewToolExecutorServiceClient(serve(t, nil, slow))
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	stream, err := client.ExecuteTool(ctx, &turnwirev1.ExecuteToolRequest{
		ToolName: "slow", ConversationId: "c", RequestId: "r", ToolCallId: "call_0_0", StepNumber: 2,
		IdempotencyKey: "tw-k-0123456789abcdef0123456789abcdef", InputJson: "{}", Rerun: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetPreliminaryOutputJson() != `"waiting"` {
		t.Fatalf("first message %v, %v", first, err)
	}
	call := wait(t, started, "the call")
	if call.ConversationID != "c" || call.RequestID != "r" || call.ToolCallID != "call_0_0" || call.ToolName != "slow" ||
		call.StepNumber != 2 || call.IdempotencyKey != "tw-k-0123456789abcdef0123456789abcdef" || call.InputJSON != "{}" ||
		!call.Rerun {
		t.Errorf("call %+v", call)
	}
	cancel()
	if err := wait(t, ended, "the tool's end"); err == nil {
		t.Errorf("Preliminary after the cancellation succeeded; want an error")
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Canceled {
		t.Errorf("after the cancellation: %v; want Canceled", err)
	}
}
