// Command conformance is the Go conformance runner: every case of
// clients/conformance/cases against real sidecars, through the Go client
// (turnwire.dev/go/turnwire). Run it with clients/conformance/go/run.sh
// [CASE_NAME ...] (GOPATH mode on Debian's Go packages, as tools/go-test.sh).
//
// It starts one `turnwire serve` per distinct config (TURNWIRE_BIN), runs the
// cases in file order, prints one line per case and "N passed, M failed", and
// exits 1 when a case failed. The case format and the matching rules:
// clients/conformance/README.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/internal/sidecar"
	"turnwire.dev/go/turnwire"
)

const (
	waitTimeout = 20 * time.Second // for `eventually` steps and background waits
	caseTimeout = 60 * time.Second
)

// missing stands for a field absent from the proto JSON.
type missingType struct{}

var missing = missingType{}

type step struct {
	Call              string                 `json:"call"`
	Request           map[string]interface{} `json:"request"`
	Expect            map[string]interface{} `json:"expect"`
	Background        *string                `json:"background"`
	Wait              *string                `json:"wait"`
	Events            int                    `json:"events"`
	Await             *string                `json:"await"`
	CancelAfterEvents *int                   `json:"cancel_after_events"`
	Eventually        bool                   `json:"eventually"`
}

type testCase struct {
	Name   string `json:"name"`
	Config string `json:"config"`
	Steps  []step `json:"steps"`
}

// -- matching (the same rules in every runner: see README.md) ------------------

func isDefault(v interface{}) bool {
	switch x := v.(type) {
	case bool:
		return !x
	case float64:
		return x == 0
	case string:
		return x == "" || x == "0" || strings.HasSuffix(x, "_UNSPECIFIED")
	case []interface{}:
		return len(x) == 0
	case map[string]interface{}:
		return len(x) == 0
	}
	return false
}

func number(v interface{}) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case string:
		if regexp.MustCompile(`^-?\d+$`).MatchString(x) {
			var f float64
			_, err := fmt.Sscan(x, &f)
			return f, err == nil
		}
	}
	return 0, false
}

func show(v interface{}) string {
	if v == missing {
		return "absent"
	}
	text, _ := json.Marshal(v)
	return string(text)
}

// match returns the mismatches of actual (proto JSON as decoded by
// encoding/json; missing when absent) against pattern.
func match(pattern, actual interface{}, where string) []string {
	if pattern == "$nonempty" {
		if actual != missing && !isDefault(actual) {
			return nil
		}
		return []string{fmt.Sprintf("%s: expected a value, got %s", where, show(actual))}
	}
	if pattern == "$absent" {
		if actual == missing || isDefault(actual) {
			return nil
		}
		return []string{fmt.Sprintf("%s: expected nothing, got %s", where, show(actual))}
	}
	object, isObject := pattern.(map[string]interface{})
	list, isList := pattern.([]interface{})
	if actual == missing {
		_, contains := object["$contains"]
		switch {
		case isDefault(pattern):
			return nil
		case isObject && !contains:
			actual = map[string]interface{}{}
		case isList:
			actual = []interface{}{}
		default:
			return []string{fmt.Sprintf("%s: expected %s, field absent", where, show(pattern))}
		}
	}
	if isObject {
		if wanted, ok := object["$contains"]; ok {
			items, ok := actual.([]interface{})
			if !ok {
				return []string{fmt.Sprintf("%s: expected a list, got %s", where, show(actual))}
			}
			var problems []string
			for _, w := range wanted.([]interface{}) {
				found := false
				for _, item := range items {
					if len(match(w, item, where)) == 0 {
						found = true
						break
					}
				}
				if !found {
					problems = append(problems, fmt.Sprintf("%s: no element matches %s", where, show(w)))
				}
			}
			return problems
		}
		got, ok := actual.(map[string]interface{})
		if !ok {
			return []string{fmt.Sprintf("%s: expected an object, got %s", where, show(actual))}
		}
		keys := make([]string, 0, len(object))
		for key := range object {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		var problems []string
		for _, key := range keys {
			value, present := got[key]
			if !present {
				value = missing
			}
			problems = append(problems, match(object[key], value, where+"."+key)...)
		}
		return problems
	}
	if isList {
		got, ok := actual.([]interface{})
		if !ok || len(got) != len(list) {
			return []string{fmt.Sprintf("%s: expected %d elements, got %s", where, len(list), show(actual))}
		}
		var problems []string
		for i := range list {
			problems = append(problems, match(list[i], got[i], fmt.Sprintf("%s[%d]", where, i))...)
		}
		return problems
	}
	if pattern == actual {
		return nil
	}
	if p, ok := number(pattern); ok {
		if a, ok := number(actual); ok && a == p {
			return nil
		}
	}
	return []string{fmt.Sprintf("%s: expected %s, got %s", where, show(pattern), show(actual))}
}

// kindsMatch reports whether the event kinds fit the pattern: each entry a
// kind, optionally with +, * or ?.
func kindsMatch(pattern []interface{}, kinds []string) bool {
	var expr strings.Builder
	expr.WriteString("^")
	for _, p := range pattern {
		entry := p.(string)
		quantifier := ""
		if last := entry[len(entry)-1:]; strings.Contains("+*?", last) {
			quantifier, entry = last, entry[:len(entry)-1]
		}
		fmt.Fprintf(&expr, "(?:%s,)%s", regexp.QuoteMeta(entry), quantifier)
	}
	expr.WriteString("$")
	var text strings.Builder
	for _, kind := range kinds {
		text.WriteString(kind + ",")
	}
	return regexp.MustCompile(expr.String()).MatchString(text.String())
}

// codeNames are the canonical gRPC code names (google/rpc/code.proto).
var codeNames = map[codes.Code]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN",
	codes.InvalidArgument: "INVALID_ARGUMENT", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
	codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED",
	codes.OutOfRange: "OUT_OF_RANGE", codes.Unimplemented: "UNIMPLEMENTED", codes.Internal: "INTERNAL",
	codes.Unavailable: "UNAVAILABLE", codes.DataLoss: "DATA_LOSS", codes.Unauthenticated: "UNAUTHENTICATED",
}

// errorView is a client error as the suite compares it.
func errorView(e *turnwire.Error) map[string]interface{} {
	metadata := map[string]interface{}{}
	for k, v := range e.Metadata {
		metadata[k] = v
	}
	violations := []interface{}{}
	for _, v := range e.FieldViolations {
		violations = append(violations, map[string]interface{}{"field": v.Field, "description": v.Description})
	}
	return map[string]interface{}{
		"code": codeNames[e.Code], "reason": e.Reason, "metadata": metadata,
		"fieldViolations": violations, "retryDelay": e.RetryDelay > 0,
	}
}

// toJSON is proto JSON (lowerCamelCase names, int64 as strings, enum names) as plain values.
func toJSON(m proto.Message) interface{} {
	text, err := protojson.Marshal(m)
	if err != nil {
		return fmt.Sprintf("(cannot encode: %v)", err)
	}
	var value interface{}
	_ = json.Unmarshal(text, &value)
	return value
}

func kindOf(event *turnwirev1.TurnEvent) string {
	m := event.ProtoReflect()
	field := m.WhichOneof(m.Descriptor().Oneofs().ByName("event"))
	if field == nil {
		return ""
	}
	return string(field.Name())
}

// -- calls ------------------------------------------------------------------------

// parse decodes a case's proto JSON request into m.
func parse(request map[string]interface{}, m proto.Message) error {
	text, err := json.Marshal(request)
	if err != nil {
		return err
	}
	return protojson.Unmarshal(text, m)
}

// openStream starts a turn-running RPC through the client's method for it.
func openStream(ctx context.Context, client *turnwire.Client, rpc string, request map[string]interface{}) (*turnwire.Stream, error) {
	var message proto.Message
	var open func() (*turnwire.Stream, error)
	switch rpc {
	case "Chat":
		req := &turnwirev1.ChatRequest{}
		message, open = req, func() (*turnwire.Stream, error) { return client.Chat(ctx, req) }
	case "SaveMessages":
		req := &turnwirev1.SaveMessagesRequest{}
		message, open = req, func() (*turnwire.Stream, error) { return client.SaveMessages(ctx, req) }
	case "ContinueLastTurn":
		req := &turnwirev1.ContinueLastTurnRequest{}
		message, open = req, func() (*turnwire.Stream, error) { return client.ContinueLastTurn(ctx, req) }
	case "ResumeTurn":
		req := &turnwirev1.ResumeTurnRequest{}
		message, open = req, func() (*turnwire.Stream, error) { return client.ResumeTurn(ctx, req) }
	case "WatchSubmission":
		req := &turnwirev1.WatchSubmissionRequest{}
		message, open = req, func() (*turnwire.Stream, error) { return client.WatchSubmission(ctx, req) }
	case "SubmitToolResults":
		req := &turnwirev1.SubmitToolResultsRequest{}
		message, open = req, func() (*turnwire.Stream, error) {
			return client.SubmitToolResults(ctx, req, continuation(req.AutoContinue)...)
		}
	case "SubmitToolApprovals":
		req := &turnwirev1.SubmitToolApprovalsRequest{}
		message, open = req, func() (*turnwire.Stream, error) {
			return client.SubmitToolApprovals(ctx, req, continuation(req.AutoContinue)...)
		}
	default:
		return nil, fmt.Errorf("unknown streaming RPC %s", rpc)
	}
	if err := parse(request, message); err != nil {
		return nil, fmt.Errorf("request of %s: %w", rpc, err)
	}
	return open()
}

// continuation is the call options of a tool answer whose case says
// autoContinue (the client continues by default; a case without it does not).
func continuation(autoContinue bool) []grpc.CallOption {
	if autoContinue {
		return nil
	}
	return []grpc.CallOption{turnwire.WithoutAutoContinue()}
}

// callUnary runs a unary RPC through the generated client on the client's
// connection; its response as proto JSON.
func callUnary(ctx context.Context, client *turnwire.Client, rpc string, request map[string]interface{}) (interface{}, error) {
	service := client.Service()
	var message proto.Message
	var call func() (proto.Message, error)
	switch rpc {
	case "GetConversation":
		req := &turnwirev1.GetConversationRequest{}
		message, call = req, func() (proto.Message, error) { return service.GetConversation(ctx, req) }
	case "ListConversations":
		req := &turnwirev1.ListConversationsRequest{}
		message, call = req, func() (proto.Message, error) { return service.ListConversations(ctx, req) }
	case "ListTurns":
		req := &turnwirev1.ListTurnsRequest{}
		message, call = req, func() (proto.Message, error) { return service.ListTurns(ctx, req) }
	case "CancelChat":
		req := &turnwirev1.CancelChatRequest{}
		message, call = req, func() (proto.Message, error) { return service.CancelChat(ctx, req) }
	case "DeleteConversation":
		req := &turnwirev1.DeleteConversationRequest{}
		message, call = req, func() (proto.Message, error) { return service.DeleteConversation(ctx, req) }
	case "ForkConversation":
		req := &turnwirev1.ForkConversationRequest{}
		message, call = req, func() (proto.Message, error) { return service.ForkConversation(ctx, req) }
	case "AddMessages":
		req := &turnwirev1.AddMessagesRequest{}
		message, call = req, func() (proto.Message, error) { return service.AddMessages(ctx, req) }
	case "SubmitMessages":
		req := &turnwirev1.SubmitMessagesRequest{}
		message, call = req, func() (proto.Message, error) { return service.SubmitMessages(ctx, req) }
	case "GetSubmission":
		req := &turnwirev1.GetSubmissionRequest{}
		message, call = req, func() (proto.Message, error) { return service.GetSubmission(ctx, req) }
	case "ListSubmissions":
		req := &turnwirev1.ListSubmissionsRequest{}
		message, call = req, func() (proto.Message, error) { return service.ListSubmissions(ctx, req) }
	case "ListWebhookDeliveries":
		req := &turnwirev1.ListWebhookDeliveriesRequest{}
		message, call = req, func() (proto.Message, error) { return service.ListWebhookDeliveries(ctx, req) }
	case "CancelSubmission":
		req := &turnwirev1.CancelSubmissionRequest{}
		message, call = req, func() (proto.Message, error) { return service.CancelSubmission(ctx, req) }
	case "CreateSchedule":
		req := &turnwirev1.CreateScheduleRequest{}
		message, call = req, func() (proto.Message, error) { return service.CreateSchedule(ctx, req) }
	case "GetSchedule":
		req := &turnwirev1.GetScheduleRequest{}
		message, call = req, func() (proto.Message, error) { return service.GetSchedule(ctx, req) }
	case "ListSchedules":
		req := &turnwirev1.ListSchedulesRequest{}
		message, call = req, func() (proto.Message, error) { return service.ListSchedules(ctx, req) }
	case "PauseSchedule":
		req := &turnwirev1.PauseScheduleRequest{}
		message, call = req, func() (proto.Message, error) { return service.PauseSchedule(ctx, req) }
	case "ResumeSchedule":
		req := &turnwirev1.ResumeScheduleRequest{}
		message, call = req, func() (proto.Message, error) { return service.ResumeSchedule(ctx, req) }
	case "DeleteSchedule":
		req := &turnwirev1.DeleteScheduleRequest{}
		message, call = req, func() (proto.Message, error) { return service.DeleteSchedule(ctx, req) }
	default:
		return nil, fmt.Errorf("unknown unary RPC %s", rpc)
	}
	if err := parse(request, message); err != nil {
		return nil, fmt.Errorf("request of %s: %w", rpc, err)
	}
	response, err := call()
	if err != nil {
		return nil, err
	}
	return toJSON(response), nil
}

var streaming = map[string]bool{
	"Chat": true, "SaveMessages": true, "ContinueLastTurn": true, "ResumeTurn": true,
	"WatchSubmission": true, "SubmitToolResults": true, "SubmitToolApprovals": true,
}

// outcome is what a turn-running call returned so far; filled by one
// goroutine, read by others (wait steps).
type outcome struct {
	mu                sync.Mutex
	events            []*turnwirev1.TurnEvent
	err               *turnwire.Error
	cancelledByClient bool
}

func (o *outcome) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.events)
}

// readStream runs a streaming step to its end (or leaves after cancel_after_events).
func readStream(ctx context.Context, client *turnwire.Client, s step, out *outcome) error {
	stream, err := openStream(ctx, client, s.Call, s.Request)
	if err != nil {
		var callErr *turnwire.Error
		if errors.As(err, &callErr) {
			out.err = callErr
			return nil
		}
		return err
	}
	defer stream.Close()
	for stream.Next() {
		out.mu.Lock()
		out.events = append(out.events, stream.Event())
		n := len(out.events)
		out.mu.Unlock()
		if s.CancelAfterEvents != nil && n >= *s.CancelAfterEvents {
			stream.Close() // client-side cancel: the call's context is cancelled
			out.cancelledByClient = true
			return nil
		}
	}
	if err := stream.Err(); err != nil {
		var callErr *turnwire.Error
		if !errors.As(err, &callErr) {
			return err
		}
		out.err = callErr
	}
	return nil
}

// checkStream checks the step's expectations and the stream rules every turn stream keeps.
func checkStream(s step, out *outcome) []string {
	expect := s.Expect
	var problems []string
	events := out.events
	kinds := make([]string, len(events))
	requestIDs := map[string]bool{}
	for i, event := range events {
		kinds[i] = kindOf(event)
		requestIDs[event.GetRequestId()] = true
	}
	if len(requestIDs) > 1 {
		problems = append(problems, fmt.Sprintf("events carry several request ids: %v", requestIDs))
	}
	first, _ := number(s.Request["afterSequenceNumber"])
	if len(events) > 0 && kinds[0] != "turn_end" {
		for i, event := range events {
			if event.GetSequenceNumber() != events[0].GetSequenceNumber()+int64(i) {
				problems = append(problems, fmt.Sprintf("sequence numbers not consecutive at event %d", i))
				break
			}
		}
		if first > 0 && events[0].GetSequenceNumber() != int64(first)+1 {
			problems = append(problems, fmt.Sprintf("resumed stream starts at %d, not %d", events[0].GetSequenceNumber(), int64(first)+1))
		}
	}
	ends := 0
	for _, kind := range kinds {
		if kind == "turn_end" {
			ends++
		}
	}
	last := ""
	if len(kinds) > 0 {
		last = kinds[len(kinds)-1]
	}
	if out.err == nil && !out.cancelledByClient && (ends != 1 || last != "turn_end") {
		problems = append(problems, fmt.Sprintf("a complete stream ends with exactly one turn_end: %v", kinds))
	}
	if pattern, ok := expect["events"].([]interface{}); ok && !kindsMatch(pattern, kinds) {
		problems = append(problems, fmt.Sprintf("event kinds %v do not fit %v", kinds, pattern))
	}
	if wanted, ok := expect["error"]; ok {
		if out.err == nil {
			problems = append(problems, fmt.Sprintf("expected the call to fail with %s, it ended with %v", show(wanted), kinds))
		} else {
			problems = append(problems, match(wanted, errorView(out.err), "error")...)
		}
	} else if out.err != nil {
		problems = append(problems, fmt.Sprintf("the call failed: %v", out.err))
	}
	var end *turnwirev1.TurnEnd
	if last == "turn_end" {
		end = events[len(events)-1].GetTurnEnd()
	}
	if wanted, ok := expect["status"]; ok {
		status := "(no turn_end)"
		if end != nil {
			status = strings.TrimPrefix(end.GetStatus().String(), "TURN_STATUS_")
		}
		if status != wanted {
			problems = append(problems, fmt.Sprintf("status %s, expected %v", status, wanted))
		}
	}
	if wanted, ok := expect["turnError"]; ok {
		if end.GetError() == nil {
			problems = append(problems, "expected TurnEnd.error, there is none")
		} else {
			problems = append(problems, match(wanted, errorView(turnwire.FromStatus(end.GetError())), "turnError")...)
		}
	}
	if wanted, ok := expect["turnEnd"]; ok {
		var actual interface{} = missing
		if end != nil {
			actual = toJSON(end)
		}
		problems = append(problems, match(wanted, actual, "turnEnd")...)
	}
	if firstOf, ok := expect["firstOf"].(map[string]interface{}); ok {
		for kind, wanted := range firstOf {
			var actual interface{} = missing
			for i, k := range kinds {
				if k == kind {
					actual = toJSON(events[i]).(map[string]interface{})[camel(kind)]
					if actual == nil {
						actual = map[string]interface{}{}
					}
					break
				}
			}
			problems = append(problems, match(wanted, actual, "firstOf."+kind)...)
		}
	}
	if wanted, ok := expect["text"]; ok {
		var text strings.Builder
		for _, event := range events {
			if delta := event.GetTextDelta(); delta != nil {
				text.WriteString(delta.GetDelta())
			}
		}
		if text.String() != wanted {
			problems = append(problems, fmt.Sprintf("text deltas join to %q, expected %q", text.String(), wanted))
		}
	}
	return problems
}

func camel(name string) string {
	parts := strings.Split(name, "_")
	for i := 1; i < len(parts); i++ {
		parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
	}
	return strings.Join(parts, "")
}

// checkUnary calls a unary step (again and again until it matches, for `eventually`).
func checkUnary(ctx context.Context, client *turnwire.Client, s step) ([]string, error) {
	giveUp := time.Now()
	if s.Eventually {
		giveUp = giveUp.Add(waitTimeout)
	}
	for {
		response, err := callUnary(ctx, client, s.Call, s.Request)
		var problems []string
		var callErr *turnwire.Error
		wanted, wantsError := s.Expect["error"]
		switch {
		case errors.As(err, &callErr) && wantsError:
			problems = match(wanted, errorView(callErr), "error")
		case errors.As(err, &callErr):
			problems = []string{fmt.Sprintf("the call failed: %v", callErr)}
		case err != nil:
			return nil, err
		case wantsError:
			problems = []string{fmt.Sprintf("expected the call to fail with %s, it answered %s", show(wanted), show(response))}
		default:
			pattern, ok := s.Expect["response"]
			if !ok {
				pattern = map[string]interface{}{}
			}
			problems = match(pattern, response, "response")
		}
		if len(problems) == 0 || time.Now().After(giveUp) {
			return problems, nil
		}
		time.Sleep(50 * time.Millisecond) // the poll interval of `eventually`
	}
}

type running struct {
	started step
	out     *outcome
	done    chan error
}

// runCase runs a case's steps in order; an error at the first unmet expectation.
func runCase(ctx context.Context, client *turnwire.Client, c testCase) error {
	background := map[string]*running{}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends background calls of a failed case
	for i, s := range c.Steps {
		where := fmt.Sprintf("step %d", i+1)
		var problems []string
		switch {
		case s.Wait != nil:
			run := background[*s.Wait]
			giveUp := time.Now().Add(waitTimeout)
			for run.out.count() < s.Events {
				if time.Now().After(giveUp) {
					return fmt.Errorf("%s: timed out waiting for %d events", where, s.Events)
				}
				time.Sleep(20 * time.Millisecond) // the poll interval
			}
			continue
		case s.Await != nil:
			run := background[*s.Await]
			delete(background, *s.Await)
			select {
			case err := <-run.done:
				if err != nil {
					return fmt.Errorf("%s: %w", where, err)
				}
			case <-time.After(waitTimeout):
				return fmt.Errorf("%s: timed out waiting for %s to end", where, *s.Await)
			}
			started := run.started
			started.Expect = s.Expect
			problems = checkStream(started, run.out)
		case streaming[s.Call] && s.Background != nil:
			run := &running{started: s, out: &outcome{}, done: make(chan error, 1)}
			background[*s.Background] = run
			go func(s step) { run.done <- readStream(ctx, client, s, run.out) }(s) // s is reused by the loop (Go 1.19)
			continue
		case streaming[s.Call]:
			out := &outcome{}
			if err := readStream(ctx, client, s, out); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
			problems = checkStream(s, out)
		default:
			var err error
			if problems, err = checkUnary(ctx, client, s); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
		}
		if len(problems) > 0 {
			name := s.Call
			if s.Await != nil {
				name = *s.Await
			}
			return fmt.Errorf("%s (%s): %s", where, name, strings.Join(problems, "; "))
		}
	}
	if len(background) > 0 {
		return fmt.Errorf("background calls never awaited: %d", len(background))
	}
	return nil
}

func loadCases(suite string, names []string) ([]testCase, error) {
	files, err := filepath.Glob(filepath.Join(suite, "cases", "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	wanted := map[string]bool{}
	for _, name := range names {
		wanted[name] = true
	}
	var cases []testCase
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		var c testCase
		if err := json.Unmarshal(text, &c); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(names) == 0 || wanted[c.Name] {
			cases = append(cases, c)
		}
	}
	return cases, nil
}

func run(suite string, names []string) (int, error) {
	cases, err := loadCases(suite, names)
	if err != nil {
		return 0, err
	}
	passed, failed := 0, 0
	var configs []string
	seen := map[string]bool{}
	for _, c := range cases {
		if !seen[c.Config] {
			seen[c.Config] = true
			configs = append(configs, c.Config)
		}
	}
	for _, config := range configs {
		text, err := os.ReadFile(filepath.Join(suite, "configs", config+".json"))
		if err != nil {
			return 0, err
		}
		var settings interface{}
		if err := json.Unmarshal(text, &settings); err != nil {
			return 0, fmt.Errorf("config %s: %w", config, err)
		}
		server, err := sidecar.Start(settings)
		if err != nil {
			return 0, err
		}
		dialCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		client, err := turnwire.Dial(dialCtx, server.Addr, grpc.WithInsecure())
		cancel()
		if err != nil {
			_ = server.Stop()
			return 0, err
		}
		for _, c := range cases {
			if c.Config != config {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
			err := runCase(ctx, client, c)
			cancel()
			if err != nil {
				failed++
				fmt.Printf("FAIL %s: %v\n", c.Name, err)
			} else {
				passed++
				fmt.Printf("ok   %s\n", c.Name)
			}
		}
		_ = client.Close()
		if err := server.Stop(); err != nil {
			return 0, err
		}
	}
	fmt.Printf("%d passed, %d failed\n", passed, failed)
	if failed > 0 || len(cases) == 0 {
		return 1, nil
	}
	return 0, nil
}

// webhookSecret signs configs/webhooks.json's calls: a public test value,
// passed to the sidecars in the environment they inherit.
const webhookSecret = "whsec_Y29uZm9ybWFuY2Ugc3VpdGUgdGVzdCBzZWNyZXQgb25seQ=="

func main() {
	if os.Getenv("CONFORMANCE_WEBHOOK_SECRET") == "" {
		os.Setenv("CONFORMANCE_WEBHOOK_SECRET", webhookSecret)
	}
	suite := os.Getenv("TURNWIRE_CONFORMANCE_DIR")
	if suite == "" {
		suite = "clients/conformance"
	}
	code, err := run(suite, os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		code = 2
	}
	os.Exit(code)
}
