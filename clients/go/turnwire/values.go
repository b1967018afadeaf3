package turnwire

import (
	"fmt"

	"google.golang.org/protobuf/types/known/structpb"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/internal/exactjson"
)

// UserText is a user message of one text part, for ChatRequest.Message.
func UserText(text string) *turnwirev1.Message {
	return &turnwirev1.Message{
		Role:  turnwirev1.Role_ROLE_USER,
		Parts: []*turnwirev1.Part{{Kind: &turnwirev1.Part_Text{Text: &turnwirev1.TextPart{Text: text}}}},
	}
}

// inputCarrier is a tool call with an input: ToolInputAvailable (an event) or
// ToolCallPart (a stored message part).
type inputCarrier interface {
	GetInputJson() string
	GetInput() *structpb.Struct
}

// outputCarrier is a tool call with a result: ToolOutputAvailable or
// ToolCallPart.
type outputCarrier interface {
	GetOutputJson() string
	GetOutput() *structpb.Value
}

// ToolInput is a tool call's input as a plain Go value, decoded from its
// input_json (the model's JSON text, exact): objects become map[string]any,
// arrays []any, numbers json.Number (exact; call Int64 or Float64), and
// strings, booleans and null string, bool and nil. Calls from servers that
// send only the deprecated Struct view fall back to it (numbers float64).
// nil, nil when the call has no input (e.g. a ToolCallPart whose input was
// not a JSON object; see its RawInput).
func ToolInput(call inputCarrier) (map[string]any, error) {
	if text := call.GetInputJson(); text != "" {
		value, err := exactjson.Decode[any](text)
		if err != nil {
			return nil, fmt.Errorf("turnwire: tool input: %w", err)
		}
		object, ok := value.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("turnwire: tool input is a JSON %T, not an object", value)
		}
		return object, nil
	}
	if input := call.GetInput(); input != nil {
		return input.AsMap(), nil
	}
	return nil, nil
}

// ToolOutput is a tool call's result as a plain Go value, decoded from its
// output_json as ToolInput decodes input_json (any JSON value); it falls
// back to the deprecated Value view likewise. nil, nil when there is no
// result.
func ToolOutput(call outputCarrier) (any, error) {
	if text := call.GetOutputJson(); text != "" {
		value, err := exactjson.Decode[any](text)
		if err != nil {
			return nil, fmt.Errorf("turnwire: tool output: %w", err)
		}
		return value, nil
	}
	if output := call.GetOutput(); output != nil {
		return output.AsInterface(), nil
	}
	return nil, nil
}

// CitedText is the text of message's text part that source cites (the part whose
// TextPart.Id is source.TextId), or "" when the source is tied to no text of it
// (docs/providers.md, "What each API's parts become").
func CitedText(message *turnwirev1.Message, source *turnwirev1.SourcePart) string {
	if source.GetTextId() == "" {
		return ""
	}
	for _, part := range message.GetParts() {
		if text := part.GetText(); text != nil && text.GetId() == source.GetTextId() {
			return text.GetText()
		}
	}
	return ""
}
