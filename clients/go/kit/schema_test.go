package kit

import (
	"encoding/json"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"
)

type schemaBase struct {
	ID   string `json:"id"`
	Note string `json:"note,omitempty"`
}

type schemaNode struct {
	Name     string        `json:"name"`
	Children []*schemaNode `json:"children,omitempty"`
}

type schemaInput struct {
	schemaBase
	Text     string            `json:"text" description:"What to say."`
	Count    int               `json:"count"`
	Size     uint32            `json:"size,omitempty"`
	Ratio    float64           `json:"ratio,omitempty"`
	Big      *big.Int          `json:"big"`
	Number   json.Number       `json:"number,omitempty"`
	Flag     bool              `json:"flag,omitempty"`
	Quoted   int64             `json:"quoted,string,omitempty"`
	Tags     []string          `json:"tags,omitempty"`
	Blob     []byte            `json:"blob,omitempty"`
	Scores   map[string]int    `json:"scores,omitempty"`
	Any      any               `json:"any,omitempty"`
	Raw      json.RawMessage   `json:"raw,omitempty"`
	When     time.Time         `json:"when,omitempty"`
	Tree     schemaNode        `json:"tree,omitempty"`
	Untagged string            // named by the field
	Skipped  string            `json:"-"`
	hidden   string            // unexported: not a property
	Labels   map[string]string `json:",omitempty"`     // named by the field, optional
	Note     int               `json:"note,omitempty"` // hides the embedded struct's note
}

func TestSchemaOfAStruct(t *testing.T) {
	schema, err := schemaOf(reflect.TypeOf(schemaInput{}))
	if err != nil {
		t.Fatal(err)
	}
	node := map[string]any{"type": "object", "properties": map[string]any{
		"name":     map[string]any{"type": "string"},
		"children": map[string]any{"type": "array", "items": map[string]any{}},
	}, "required": []any{"name"}}
	want := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"id":       map[string]any{"type": "string"},
			"note":     map[string]any{"type": "integer"},
			"text":     map[string]any{"type": "string", "description": "What to say."},
			"count":    map[string]any{"type": "integer"},
			"size":     map[string]any{"type": "integer", "minimum": 0},
			"ratio":    map[string]any{"type": "number"},
			"big":      map[string]any{"type": "integer"},
			"number":   map[string]any{"type": "number"},
			"flag":     map[string]any{"type": "boolean"},
			"quoted":   map[string]any{"type": "string"},
			"tags":     map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
			"blob":     map[string]any{"type": "string", "contentEncoding": "base64"},
			"scores":   map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "integer"}},
			"any":      map[string]any{},
			"raw":      map[string]any{},
			"when":     map[string]any{"type": "string", "format": "date-time"},
			"tree":     node,
			"Untagged": map[string]any{"type": "string"},
			"Labels":   map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}},
		},
		// Fields first, in order, then the embedded struct's.
		"required": []any{"text", "count", "big", "Untagged", "id"},
	}
	if !reflect.DeepEqual(schema, want) {
		got, _ := json.MarshalIndent(schema, "", " ")
		t.Fatalf("schema:\n%s", got)
	}
}

func TestSchemaOfOtherTypes(t *testing.T) {
	for _, c := range []struct {
		value any
		want  map[string]any
	}{
		{map[string]any{}, map[string]any{"type": "object", "additionalProperties": map[string]any{}}},
		{struct{}{}, map[string]any{"type": "object", "properties": map[string]any{}}},
		{[2]bool{}, map[string]any{"type": "array", "items": map[string]any{"type": "boolean"}}},
		{new(*big.Float), map[string]any{"type": "number"}},
		{time.Duration(0), map[string]any{"type": "integer"}},
	} {
		schema, err := schemaOf(reflect.TypeOf(c.value))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(schema, c.want) {
			t.Errorf("schemaOf(%T) = %v; want %v", c.value, schema, c.want)
		}
	}
}

func TestSchemaOfATypeWithNoJSONForm(t *testing.T) {
	_, err := schemaOf(reflect.TypeOf(struct {
		Done chan int `json:"done"`
	}{}))
	if err == nil || !strings.Contains(err.Error(), "field Done: chan int has no JSON form") {
		t.Fatalf("error %v; want one naming the field and its type", err)
	}
}
