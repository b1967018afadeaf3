// Package exactjson reads and writes the JSON text of tool inputs and outputs
// without losing integers: Turnwire carries them as text (input_json,
// output_json) so that integers of any size stay exact (docs/tools.md), and
// both the client (package turnwire) and the kit (package kit) keep them so.
package exactjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
)

// Decode reads one JSON value (RFC 8259) into a T as encoding/json does, with
// numbers that land in an interface (any, map[string]any, []any) as
// json.Number, so they stay exact; data after the value is an error.
func Decode[T any](text string) (T, error) {
	var value T
	decoder := json.NewDecoder(strings.NewReader(text))
	decoder.UseNumber()
	if err := decoder.Decode(&value); err != nil {
		return value, err
	}
	if _, err := decoder.Token(); !errors.Is(err, io.EOF) {
		return value, errors.New("data after the JSON value")
	}
	return value, nil
}

// Encode writes value as compact JSON text as encoding/json does (json.Number,
// *big.Int, int64 and uint64 exact), without escaping <, > and & (the text is
// data for a model, not HTML).
func Encode(value any) (string, error) {
	var out bytes.Buffer
	encoder := json.NewEncoder(&out)
	encoder.SetEscapeHTML(false)
	if err := encoder.Encode(value); err != nil {
		return "", err
	}
	return strings.TrimSuffix(out.String(), "\n"), nil
}
