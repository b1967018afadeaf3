package turnwire_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/turnwire"
)

func TestToolInputDecodesExactJSON(t *testing.T) {
	input, err := turnwire.ToolInput(&turnwirev1.ToolCallPart{InputJson: `{"n": 9007199254740993, "x": [1.5, true, null, "s"]}`})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"n": json.Number("9007199254740993"), "x": []any{json.Number("1.5"), true, nil, "s"}}
	if !reflect.DeepEqual(input, want) {
		t.Errorf("got %#v; want %#v", input, want)
	}
}

func TestToolInputRejectsWhatIsNotOneObject(t *testing.T) {
	for _, text := range []string{`[1]`, `{"a": 1} {}`, `{"a":`} {
		if _, err := turnwire.ToolInput(&turnwirev1.ToolCallPart{InputJson: text}); err == nil {
			t.Errorf("input_json %s: no error", text)
		}
	}
}

func TestToolValuesFallBackToTheStructView(t *testing.T) {
	input, _ := structpb.NewStruct(map[string]any{"city": "Paris"})
	output := structpb.NewNumberValue(2)
	// The deprecated views, as a server without input_json / output_json sends them.
	call := &turnwirev1.ToolCallPart{Input: input, Output: output}
	gotInput, err := turnwire.ToolInput(call)
	if err != nil || !reflect.DeepEqual(gotInput, map[string]any{"city": "Paris"}) {
		t.Errorf("ToolInput: %#v, %v", gotInput, err)
	}
	gotOutput, err := turnwire.ToolOutput(call)
	if err != nil || gotOutput != 2.0 {
		t.Errorf("ToolOutput: %#v, %v", gotOutput, err)
	}
	if got, err := turnwire.ToolOutput(&turnwirev1.ToolCallPart{}); got != nil || err != nil {
		t.Errorf("ToolOutput of a call without a result: %#v, %v", got, err)
	}
}

func TestCitedTextIsTheTextPartASourceNames(t *testing.T) {
	source := &turnwirev1.SourcePart{SourceId: "s1", CitedText: "It is 330 metres tall.", TextId: "b2"}
	message := &turnwirev1.Message{Parts: []*turnwirev1.Part{
		{Kind: &turnwirev1.Part_Text{Text: &turnwirev1.TextPart{Text: "Plain. "}}},
		{Kind: &turnwirev1.Part_Text{Text: &turnwirev1.TextPart{Text: "330 m tall", Id: "b2"}}},
		{Kind: &turnwirev1.Part_Source{Source: source}},
	}}
	if got := turnwire.CitedText(message, source); got != "330 m tall" {
		t.Errorf("got %q; want the cited part's text", got)
	}
	if got := turnwire.CitedText(message, &turnwirev1.SourcePart{SourceId: "s2"}); got != "" {
		t.Errorf("a source tied to no text: got %q", got)
	}
}

// The sidecar's UNKNOWN_MODEL status holds the field and the description in its own words;
// Error() repeated the whole description after it.
func TestErrorStatesAViolationItsMessageHoldsOnce(t *testing.T) {
	said := "model 'nope:x' names provider 'nope', which is not configured; configured: ['scripted']"
	e := &turnwire.Error{Code: codes.InvalidArgument, Reason: "UNKNOWN_MODEL", Message: said,
		FieldViolations: []turnwire.FieldViolation{{Field: "model", Description: said}}}
	if got, want := e.Error(), "InvalidArgument [UNKNOWN_MODEL]: "+said; got != want {
		t.Errorf("got %q; want %q", got, want)
	}
	e = &turnwire.Error{Code: codes.InvalidArgument, Message: "unknown",
		FieldViolations: []turnwire.FieldViolation{{Field: "model", Description: "unknown"}}}
	if got, want := e.Error(), "InvalidArgument: unknown; model: unknown"; got != want {
		t.Errorf("got %q; want %q", got, want)
	}
}
