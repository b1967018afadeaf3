package kit

import (
	"encoding"
	"encoding/json"
	"fmt"
	"math/big"
	"reflect"
	"sort"
	"strings"
	"time"
)

var (
	numberType          = reflect.TypeOf(json.Number(""))
	rawMessageType      = reflect.TypeOf(json.RawMessage(nil))
	bigIntType          = reflect.TypeOf(big.Int{})
	bigFloatType        = reflect.TypeOf(big.Float{})
	timeType            = reflect.TypeOf(time.Time{})
	jsonUnmarshalerType = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()
	textUnmarshalerType = reflect.TypeOf((*encoding.TextUnmarshaler)(nil)).Elem()
)

// schemaOf is the JSON Schema (as the map structpb.NewStruct takes) of the
// JSON that encoding/json reads into a value of type t:
//
//   - bool: boolean; signed integers and *big.Int: integer; unsigned integers:
//     integer with minimum 0; floats, json.Number and *big.Float: number;
//     string: string; time.Time: string with format date-time; []byte:
//     string (base64, as encoding/json reads it);
//   - slices and arrays: array of their element's schema; maps: object whose
//     additionalProperties are the value's schema;
//   - structs: object with a property per field encoding/json fills (the json
//     tag's name, fields of untagged embedded structs inlined, "-" skipped,
//     ",string" fields as string), each with the field's `description:"..."`
//     tag; a field is required unless its json tag says omitempty;
//   - pointers: their element's schema; interfaces, json.RawMessage, other
//     json.Unmarshaler types and a struct inside itself: {} (any value);
//     other encoding.TextUnmarshaler types: string.
//
// Channels, functions and complex numbers have no JSON form: an error.
func schemaOf(t reflect.Type) (map[string]any, error) {
	return (&schemaBuilder{building: map[reflect.Type]bool{}}).schema(t)
}

type schemaBuilder struct {
	building map[reflect.Type]bool // structs being built: a recursive type refers to itself
}

func (b *schemaBuilder) schema(t reflect.Type) (map[string]any, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t {
	case numberType, bigFloatType:
		return map[string]any{"type": "number"}, nil
	case bigIntType:
		return map[string]any{"type": "integer"}, nil
	case timeType:
		return map[string]any{"type": "string", "format": "date-time"}, nil
	case rawMessageType:
		return map[string]any{}, nil
	}
	pointer := reflect.PointerTo(t)
	if pointer.Implements(jsonUnmarshalerType) {
		return map[string]any{}, nil
	}
	if pointer.Implements(textUnmarshalerType) {
		return map[string]any{"type": "string"}, nil
	}
	switch t.Kind() {
	case reflect.Bool:
		return map[string]any{"type": "boolean"}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return map[string]any{"type": "integer"}, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return map[string]any{"type": "integer", "minimum": 0}, nil
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}, nil
	case reflect.String:
		return map[string]any{"type": "string"}, nil
	case reflect.Interface:
		return map[string]any{}, nil
	case reflect.Slice, reflect.Array:
		if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string", "contentEncoding": "base64"}, nil
		}
		items, err := b.schema(t.Elem())
		if err != nil {
			return nil, err
		}
		return map[string]any{"type": "array", "items": items}, nil
	case reflect.Map:
		values, err := b.schema(t.Elem())
		if err != nil {
			return nil, err
		}
		return map[string]any{"type": "object", "additionalProperties": values}, nil
	case reflect.Struct:
		return b.object(t)
	}
	return nil, fmt.Errorf("%s has no JSON form", t)
}

func (b *schemaBuilder) object(t reflect.Type) (map[string]any, error) {
	if b.building[t] {
		return map[string]any{}, nil
	}
	b.building[t] = true
	defer delete(b.building, t)
	properties := map[string]any{}
	var required []any
	if err := b.fields(t, properties, &required); err != nil {
		return nil, err
	}
	schema := map[string]any{"type": "object", "properties": properties}
	if len(required) > 0 {
		schema["required"] = required
	}
	return schema, nil
}

// fields adds the properties of struct t's fields; a name already present
// (from an outer struct) is kept, as encoding/json prefers the shallower field.
func (b *schemaBuilder) fields(t reflect.Type, properties map[string]any, required *[]any) error {
	var embedded []reflect.Type
	for i := 0; i < t.NumField(); i++ {
		field := t.Field(i)
		tag, tagged := field.Tag.Lookup("json")
		if tag == "-" {
			continue
		}
		name, options, _ := strings.Cut(tag, ",")
		if field.Anonymous && name == "" {
			inner := field.Type
			if inner.Kind() == reflect.Pointer {
				inner = inner.Elem()
			}
			if inner.Kind() == reflect.Struct {
				embedded = append(embedded, inner)
				continue
			}
		}
		if !field.IsExported() {
			continue
		}
		if !tagged || name == "" {
			name = field.Name
		}
		if _, taken := properties[name]; taken {
			continue
		}
		schema, err := b.schema(field.Type)
		if err != nil {
			return fmt.Errorf("field %s: %w", field.Name, err)
		}
		if hasOption(options, "string") && isScalar(field.Type) {
			schema = map[string]any{"type": "string"}
		}
		if description := field.Tag.Get("description"); description != "" {
			schema["description"] = description
		}
		properties[name] = schema
		if !hasOption(options, "omitempty") {
			*required = append(*required, name)
		}
	}
	for _, inner := range embedded {
		if err := b.fields(inner, properties, required); err != nil {
			return err
		}
	}
	return nil
}

func hasOption(options, option string) bool {
	for _, o := range strings.Split(options, ",") {
		if o == option {
			return true
		}
	}
	return false
}

// isScalar: the kinds encoding/json's ",string" option applies to.
func isScalar(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.String, reflect.Float32, reflect.Float64,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return true
	}
	return false
}

// missingMember walks value (decoded JSON: map[string]any, []any, scalars)
// along schema (as schemaOf builds it) and returns the dotted path of the
// first required member that is absent or null (null: true), objects' own
// members before their nested ones, in name order; "" when none is.
func missingMember(schema map[string]any, value any, prefix string) (path string, null bool) {
	switch value := value.(type) {
	case map[string]any:
		required, _ := schema["required"].([]any)
		for _, name := range required {
			member, present := value[name.(string)]
			if !present || member == nil {
				return prefix + name.(string), present
			}
		}
		properties, _ := schema["properties"].(map[string]any)
		additional, _ := schema["additionalProperties"].(map[string]any)
		names := make([]string, 0, len(value))
		for name := range value {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			member, ok := properties[name].(map[string]any)
			if !ok {
				member = additional
			}
			if path, null := missingMember(member, value[name], prefix+name+"."); path != "" {
				return path, null
			}
		}
	case []any:
		items, _ := schema["items"].(map[string]any)
		for i, item := range value {
			if path, null := missingMember(items, item, fmt.Sprintf("%s%d.", prefix, i)); path != "" {
				return path, null
			}
		}
	}
	return "", false
}
