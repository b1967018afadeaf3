package kit_test

import (
	"context"
	"errors"
	"io"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/kit"
)

// callTimeout bounds every wait of a test (in-process calls take microseconds).
const callTimeout = 20 * time.Second

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// serve registers hooks and tools on a gRPC server of 127.0.0.1 and returns a
// connection to it; both stop when the test ends.
func serve(t *testing.T, hooks *kit.Hooks, tools ...kit.ToolDefinition) *grpc.ClientConn {
	t.Helper()
	server := grpc.NewServer()
	if err := kit.Register(server, hooks, tools...); err != nil {
		t.Fatal(err)
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go server.Serve(listener) //nolint:errcheck // ends with Stop
	t.Cleanup(server.Stop)
	conn, err := grpc.Dial(listener.Addr().String(), grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// wait receives from ch within callTimeout.
func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case value := <-ch:
		return value
	case <-time.After(callTimeout):
		t.Fatalf("no %s within %s", what, callTimeout)
		panic("unreachable")
	}
}

func TestSubscriptionsAreTheHandlersSet(t *testing.T) {
	hooks := &kit.Hooks{
		IncludeMessages: true,
		// Set out of the enum's order: the answer is in the enum's order.
		OnChatError: func(context.Context, *turnwirev1.OnChatErrorRequest) (*turnwirev1.OnChatErrorResponse, error) {
			return nil, nil
		},
		OnChunks: func(context.Context, *kit.Chunks) error { return nil },
		BeforeTurn: func(context.Context, *turnwirev1.BeforeTurnRequest) (*turnwirev1.BeforeTurnResponse, error) {
			return nil, nil
		},
	}
	client := turnwirev1.NewTurnHooksServiceClient(serve(t, hooks))
	got, err := client.GetHookSubscriptions(testContext(t), &turnwirev1.GetHookSubscriptionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := []turnwirev1.Hook{
		turnwirev1.Hook_HOOK_BEFORE_TURN, turnwirev1.Hook_HOOK_ON_CHUNKS, turnwirev1.Hook_HOOK_ON_CHAT_ERROR,
	}
	if !reflect.DeepEqual(got.GetHooks(), want) || !got.GetIncludeMessages() || !got.GetHookSession() || !got.GetHookSessionChunks() {
		t.Fatalf("subscriptions %v; want hooks %v, include_messages, hook_session and hook_session_chunks", got, want)
	}
	// A hook not set is not served.
	_, err = client.BeforeStep(testContext(t), &turnwirev1.BeforeStepRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("BeforeStep: %v; want Unimplemented", err)
	}
}

func TestRegisterRefusesWhatCannotServe(t *testing.T) {
	run := func(context.Context, *kit.Call, struct{}) (string, error) { return "", nil }
	for _, c := range []struct {
		hooks *kit.Hooks
		tools []kit.ToolDefinition
		want  string
	}{
		{nil, nil, "no hooks and no tools"},
		{&kit.Hooks{IncludeMessages: true}, nil, "set no handler"},
		{&kit.Hooks{Observe: []turnwirev1.Hook{turnwirev1.Hook_HOOK_AFTER_TOOL_CALL}, AfterToolCall: func(context.Context, *turnwirev1.AfterToolCallRequest) error {
			return nil
		}}, nil, "HOOK_AFTER_TOOL_CALL, not a hook you can observe (HOOK_BEFORE_TURN, HOOK_BEFORE_STEP, HOOK_BEFORE_TOOL_CALL, HOOK_ON_CHAT_RESPONSE, HOOK_ON_CHAT_ERROR); the sidecar never waits for it on a HookSession anyway"},
		{&kit.Hooks{Observe: []turnwirev1.Hook{turnwirev1.Hook_HOOK_CLASSIFY_CHAT_ERROR}, ClassifyChatError: func(context.Context, *turnwirev1.ClassifyChatErrorRequest) (turnwirev1.ChatErrorClassification, error) {
			return 0, nil
		}}, nil, "HOOK_CLASSIFY_CHAT_ERROR, not a hook you can observe"},
		{&kit.Hooks{Observe: []turnwirev1.Hook{turnwirev1.Hook_HOOK_BEFORE_STEP}, BeforeTurn: failing}, nil, "HOOK_BEFORE_STEP, whose handler is not set"},
		{&kit.Hooks{Observe: []turnwirev1.Hook{turnwirev1.Hook_HOOK_ON_CHAT_RESPONSE}, OnChatError: replaceError}, nil, "HOOK_ON_CHAT_RESPONSE, whose handler is not set"},
		{&kit.Hooks{Observe: []turnwirev1.Hook{turnwirev1.Hook_HOOK_ON_CHAT_ERROR}, BeforeTurn: failing}, nil, "HOOK_ON_CHAT_ERROR, whose handler is not set"},
		{nil, []kit.ToolDefinition{kit.Tool[struct{}, string]{Name: "a b", Run: run}}, `tool name "a b"`},
		{nil, []kit.ToolDefinition{kit.Tool[struct{}, string]{Name: "a"}}, `tool "a" has no Run`},
		{nil, []kit.ToolDefinition{
			kit.Tool[struct{}, string]{Name: "a", Run: run}, kit.Tool[struct{}, string]{Name: "a", Run: run},
		}, `two tools are named "a"`},
		{nil, []kit.ToolDefinition{kit.Tool[[]string, string]{
			Name: "a", Run: func(context.Context, *kit.Call, []string) (string, error) { return "", nil },
		}}, "must be a JSON object"},
	} {
		err := kit.Register(grpc.NewServer(), c.hooks, c.tools...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Register: %v; want an error with %q", err, c.want)
		}
	}
}

// An observed hook (Hooks.Observe; hooks.proto, observed_hooks) is listed as
// such, and a change it returns is answered as no change, on the unary RPC
// and on HookSession alike, logged once per hook; its error is still the
// call's.
func TestObservedHooksAnswerNoChange(t *testing.T) {
	logged := captureLog(t)
	hooks := &kit.Hooks{
		// Out of the enum's order, one twice.
		Observe: []turnwirev1.Hook{
			turnwirev1.Hook_HOOK_BEFORE_TOOL_CALL, turnwirev1.Hook_HOOK_BEFORE_STEP, turnwirev1.Hook_HOOK_BEFORE_TOOL_CALL,
		},
		BeforeTurn: failing, // not observed: its change is answered
		BeforeStep: func(_ context.Context, r *turnwirev1.BeforeStepRequest) (*turnwirev1.BeforeStepResponse, error) {
			if r.GetSystem() == "fail" {
				return nil, status.Error(codes.PermissionDenied, "not this step")
			}
			return &turnwirev1.BeforeStepResponse{System: ptr("")}, nil // a change, though empty text
		},
		BeforeToolCall: policy,
	}
	s := openSession(t, hooks)
	subscriptions, err := s.client.GetHookSubscriptions(testContext(t), &turnwirev1.GetHookSubscriptionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	subscribed := []turnwirev1.Hook{turnwirev1.Hook_HOOK_BEFORE_TURN, turnwirev1.Hook_HOOK_BEFORE_STEP, turnwirev1.Hook_HOOK_BEFORE_TOOL_CALL}
	if observed := subscribed[1:]; !reflect.DeepEqual(subscriptions.GetHooks(), subscribed) || !reflect.DeepEqual(subscriptions.GetObservedHooks(), observed) {
		t.Fatalf("subscriptions %v; want hooks %v, observed_hooks %v", subscriptions, subscribed, observed)
	}

	deleteCall := &turnwirev1.BeforeToolCallRequest{Call: &turnwirev1.ToolCallInfo{ToolName: "delete"}}
	for i := 0; i < 2; i++ {
		step, err := s.client.BeforeStep(testContext(t), &turnwirev1.BeforeStepRequest{})
		if err != nil || proto.Size(step) != 0 {
			t.Fatalf("the observed BeforeStep: %v, %v; want an empty response", step, err)
		}
		decision, err := s.client.BeforeToolCall(testContext(t), deleteCall)
		if err != nil || proto.Size(decision) != 0 {
			t.Fatalf("the observed BeforeToolCall: %v, %v; want an empty response", decision, err)
		}
	}
	noDecision := &turnwirev1.BeforeToolCallRequest{Call: &turnwirev1.ToolCallInfo{ToolName: "other"}}
	if decision, err := s.client.BeforeToolCall(testContext(t), noDecision); err != nil || proto.Size(decision) != 0 {
		t.Fatalf("the observed BeforeToolCall answering nil: %v, %v; want an empty response", decision, err)
	}
	if _, err := s.client.BeforeStep(testContext(t), &turnwirev1.BeforeStepRequest{System: "fail"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("the observed BeforeStep failing: %v; want PermissionDenied", err)
	}
	if turn, err := s.client.BeforeTurn(testContext(t), &turnwirev1.BeforeTurnRequest{System: "hi"}); err != nil || turn.GetSystem() != "hi!" {
		t.Fatalf("BeforeTurn: %v, %v; want its change", turn, err)
	}

	s.send(
		&turnwirev1.HookCall{Id: 1, Hook: &turnwirev1.HookCall_BeforeStep{BeforeStep: &turnwirev1.BeforeStepRequest{}}},
		&turnwirev1.HookCall{Id: 2, Hook: &turnwirev1.HookCall_BeforeToolCall{BeforeToolCall: deleteCall}},
		&turnwirev1.HookCall{Id: 3, Hook: &turnwirev1.HookCall_BeforeStep{BeforeStep: &turnwirev1.BeforeStepRequest{System: "fail"}}},
	)
	if answer := s.next(1); answer.GetBeforeStep() == nil || proto.Size(answer.GetBeforeStep()) != 0 || answer.GetError() != nil {
		t.Errorf("the observed BeforeStep on HookSession: %v; want an empty response", answer)
	}
	if answer := s.next(2); answer.GetBeforeToolCall() == nil || proto.Size(answer.GetBeforeToolCall()) != 0 || answer.GetError() != nil {
		t.Errorf("the observed BeforeToolCall on HookSession: %v; want an empty response", answer)
	}
	if answer := s.next(3); codes.Code(answer.GetError().GetCode()) != codes.PermissionDenied {
		t.Errorf("the observed BeforeStep failing on HookSession: %v; want a PermissionDenied error answer", answer)
	}

	for hook, want := range map[string]int{"BeforeStep": 1, "BeforeToolCall": 1, "BeforeTurn": 0} {
		if n := strings.Count(logged.String(), "kit: "+hook+" is observed (Hooks.Observe): its answer is ignored"); n != want {
			t.Errorf("%s's ignored answers were logged %d times; want %d: %q", hook, n, want, logged.String())
		}
	}
}

// The turn's end hooks may be observed too (hooks.proto, observed_hooks):
// they are declared as such, an observed OnChatError's change is answered as
// no change (logged once), on the unary RPC and on HookSession alike, and its
// error is still the call's; OnChatResponse is called as before.
func TestObservedEndHooks(t *testing.T) {
	logged := captureLog(t)
	responses := make(chan string, 4)
	hooks := &kit.Hooks{
		Observe:    []turnwirev1.Hook{turnwirev1.Hook_HOOK_ON_CHAT_ERROR, turnwirev1.Hook_HOOK_ON_CHAT_RESPONSE},
		BeforeTurn: failing, // not observed
		OnChatResponse: func(_ context.Context, r *turnwirev1.OnChatResponseRequest) error {
			responses <- r.GetTurn().GetRequestId()
			return nil
		},
		OnChatError: replaceError,
	}
	s := openSession(t, hooks)
	subscriptions, err := s.client.GetHookSubscriptions(testContext(t), &turnwirev1.GetHookSubscriptionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if observed := []turnwirev1.Hook{turnwirev1.Hook_HOOK_ON_CHAT_RESPONSE, turnwirev1.Hook_HOOK_ON_CHAT_ERROR}; !reflect.DeepEqual(subscriptions.GetObservedHooks(), observed) {
		t.Fatalf("observed_hooks %v; want %v", subscriptions.GetObservedHooks(), observed)
	}

	failure := &turnwirev1.OnChatErrorRequest{Failure: &turnwirev1.ChatErrorInfo{Stage: "step"}}
	for i := 0; i < 2; i++ {
		if answer, err := s.client.OnChatError(testContext(t), failure); err != nil || proto.Size(answer) != 0 {
			t.Fatalf("the observed OnChatError: %v, %v; want an empty response", answer, err)
		}
	}
	failed := &turnwirev1.OnChatErrorRequest{Failure: &turnwirev1.ChatErrorInfo{Stage: "fail"}}
	if _, err := s.client.OnChatError(testContext(t), failed); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("the observed OnChatError failing: %v; want PermissionDenied", err)
	}
	if answer, err := s.client.OnChatResponse(testContext(t), &turnwirev1.OnChatResponseRequest{Turn: &turnwirev1.TurnInfo{RequestId: "r1"}}); err != nil || wait(t, responses, "OnChatResponse") != "r1" {
		t.Fatalf("the observed OnChatResponse: %v, %v; want it called", answer, err)
	}

	s.send(
		&turnwirev1.HookCall{Id: 1, Hook: &turnwirev1.HookCall_OnChatResponse{OnChatResponse: &turnwirev1.OnChatResponseRequest{Turn: &turnwirev1.TurnInfo{RequestId: "r2"}}}},
		&turnwirev1.HookCall{Id: 2, Hook: &turnwirev1.HookCall_OnChatError{OnChatError: failure}},
		&turnwirev1.HookCall{Id: 3, Hook: &turnwirev1.HookCall_OnChatError{OnChatError: failed}},
	)
	if answer := s.next(1); answer.GetOnChatResponse() == nil || answer.GetError() != nil || wait(t, responses, "OnChatResponse") != "r2" {
		t.Errorf("the observed OnChatResponse on HookSession: %v; want it called and answered", answer)
	}
	if answer := s.next(2); answer.GetOnChatError() == nil || proto.Size(answer.GetOnChatError()) != 0 || answer.GetError() != nil {
		t.Errorf("the observed OnChatError on HookSession: %v; want an empty response", answer)
	}
	if answer := s.next(3); codes.Code(answer.GetError().GetCode()) != codes.PermissionDenied {
		t.Errorf("the observed OnChatError failing on HookSession: %v; want a PermissionDenied error answer", answer)
	}

	for hook, want := range map[string]int{"OnChatError": 1, "OnChatResponse": 0} {
		if n := strings.Count(logged.String(), "kit: "+hook+" is observed (Hooks.Observe): its answer is ignored"); n != want {
			t.Errorf("%s's ignored answers were logged %d times; want %d: %q", hook, n, want, logged.String())
		}
	}

	// Not observed, the same handler's change is answered.
	client := turnwirev1.NewTurnHooksServiceClient(serve(t, &kit.Hooks{OnChatError: replaceError}))
	if answer, err := client.OnChatError(testContext(t), failure); err != nil || answer.GetMessage() != "step failed" {
		t.Fatalf("OnChatError: %v, %v; want its change", answer, err)
	}
}

// replaceError replaces the failed turn's message with its stage's, or fails
// with PermissionDenied for the stage "fail".
func replaceError(_ context.Context, r *turnwirev1.OnChatErrorRequest) (*turnwirev1.OnChatErrorResponse, error) {
	if r.GetFailure().GetStage() == "fail" {
		return nil, status.Error(codes.PermissionDenied, "not this error")
	}
	return &turnwirev1.OnChatErrorResponse{Message: ptr(r.GetFailure().GetStage() + " failed")}, nil
}

// policy blocks the tool "delete", rewrites "echo"'s text "secret", and
// substitutes "weather"'s result.
func policy(_ context.Context, r *turnwirev1.BeforeToolCallRequest) (*turnwirev1.BeforeToolCallResponse, error) {
	switch r.GetCall().GetToolName() {
	case "delete":
		return kit.Block("delete is disabled"), nil
	case "echo":
		input, err := kit.DecodeJSON[map[string]any](r.GetCall().GetInputJson())
		if err != nil {
			return nil, err
		}
		if input["text"] == "secret" {
			input["text"] = "[redacted]"
			return kit.AllowWithInput(input)
		}
	case "weather":
		return kit.Substitute(map[string]any{"city": "Paris", "celsius": 21})
	}
	return nil, nil
}

func TestBeforeToolCallDecisions(t *testing.T) {
	client := turnwirev1.NewTurnHooksServiceClient(serve(t, &kit.Hooks{BeforeToolCall: policy}))
	decide := func(tool, input string) *turnwirev1.BeforeToolCallResponse {
		t.Helper()
		response, err := client.BeforeToolCall(testContext(t), &turnwirev1.BeforeToolCallRequest{
			Call: &turnwirev1.ToolCallInfo{ToolName: tool, InputJson: input},
		})
		if err != nil {
			t.Fatal(err)
		}
		return response
	}
	if got := decide("delete", "{}").GetBlock().GetReason(); got != "delete is disabled" {
		t.Errorf("delete: block reason %q", got)
	}
	// The input is decoded and encoded again with its integers exact.
	got := decide("echo", `{"text":"secret","big":123456789012345678901234567890,"nested":{"n":-18446744073709551617}}`)
	if want := `{"big":123456789012345678901234567890,"nested":{"n":-18446744073709551617},"text":"[redacted]"}`; got.GetAllowWithInput().GetInputJson() != want {
		t.Errorf("echo secret: %v; want allow with input %s", got, want)
	}
	if got := decide("weather", "{}").GetSubstitute().GetOutputJson(); got != `{"celsius":21,"city":"Paris"}` {
		t.Errorf("weather: substitute %q", got)
	}
	// No decision: an empty response, which runs the call as it is.
	if got := decide("echo", `{"text":"hi"}`); got.GetDecision() != nil {
		t.Errorf("echo hi: %v; want no decision", got)
	}
	if _, err := kit.AllowWithInput([]int{1}); err == nil || !strings.Contains(err.Error(), "must be a JSON object") {
		t.Errorf("AllowWithInput of an array: %v; want an error", err)
	}
}

// failing fails BeforeTurn as its request's system prompt says.
func failing(ctx context.Context, r *turnwirev1.BeforeTurnRequest) (*turnwirev1.BeforeTurnResponse, error) {
	switch r.GetSystem() {
	case "status":
		return nil, status.Error(codes.PermissionDenied, "not this tenant")
	case "plain":
		return nil, errors.New("out of coffee")
	case "panic":
		panic("a bug in the handler")
	case "metadata":
		info := kit.CallInfo(ctx)
		return &turnwirev1.BeforeTurnResponse{System: ptr(info.ParentRequestID + "|" + info.TraceContext["traceparent"] + "|" + info.Metadata.Get("tenant")[0])}, nil
	}
	return &turnwirev1.BeforeTurnResponse{System: ptr(r.GetSystem() + "!")}, nil
}

func ptr[T any](v T) *T { return &v }

func TestHandlerErrorsBecomeStatuses(t *testing.T) {
	client := turnwirev1.NewTurnHooksServiceClient(serve(t, &kit.Hooks{BeforeTurn: failing}))
	for system, want := range map[string]*status.Status{
		"status": status.New(codes.PermissionDenied, "not this tenant"),
		"plain":  status.New(codes.Unknown, "out of coffee"),
		"panic":  status.New(codes.Internal, "kit: BeforeTurn panicked"),
	} {
		_, err := client.BeforeTurn(testContext(t), &turnwirev1.BeforeTurnRequest{System: system})
		if got := status.Convert(err); got.Code() != want.Code() || got.Message() != want.Message() {
			t.Errorf("%s: %v; want %v", system, err, want.Err())
		}
	}
	// The server still answers after the panic.
	response, err := client.BeforeTurn(testContext(t), &turnwirev1.BeforeTurnRequest{System: "be brief"})
	if err != nil || response.GetSystem() != "be brief!" {
		t.Fatalf("after the panic: %v, %v", response, err)
	}
}

func TestHookSessionAnswersInOrderWithTheSameHandlers(t *testing.T) {
	observed := make(chan string, 4)
	hooks := &kit.Hooks{
		BeforeTurn:     failing,
		BeforeToolCall: policy,
		AfterToolCall: func(_ context.Context, r *turnwirev1.AfterToolCallRequest) error {
			observed <- r.GetCall().GetToolName()
			return nil
		},
	}
	client := turnwirev1.NewTurnHooksServiceClient(serve(t, hooks))
	ctx := metadata.AppendToOutgoingContext(testContext(t), kit.ParentRequestMetadata, "r-1", "tenant", "acme")
	stream, err := client.HookSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	call := func(id uint64, hook any, trace map[string]string) *turnwirev1.HookCall {
		c := &turnwirev1.HookCall{Id: id, TraceContext: trace}
		switch h := hook.(type) {
		case *turnwirev1.BeforeTurnRequest:
			c.Hook = &turnwirev1.HookCall_BeforeTurn{BeforeTurn: h}
		case *turnwirev1.BeforeToolCallRequest:
			c.Hook = &turnwirev1.HookCall_BeforeToolCall{BeforeToolCall: h}
		case *turnwirev1.AfterToolCallRequest:
			c.Hook = &turnwirev1.HookCall_AfterToolCall{AfterToolCall: h}
		case *turnwirev1.OnChatErrorRequest:
			c.Hook = &turnwirev1.HookCall_OnChatError{OnChatError: h}
		}
		return c
	}
	traceparent := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	requests := []*turnwirev1.HookSessionRequest{
		{Calls: []*turnwirev1.HookCall{
			call(1, &turnwirev1.BeforeTurnRequest{System: "metadata"}, map[string]string{"traceparent": traceparent}),
		}},
		// An observing call held and sent with the next ones, as the sidecar does.
		{Calls: []*turnwirev1.HookCall{
			call(2, &turnwirev1.AfterToolCallRequest{Call: &turnwirev1.ToolCallInfo{ToolName: "echo"}}, nil),
			call(3, &turnwirev1.BeforeTurnRequest{System: "status"}, nil),
			call(4, &turnwirev1.BeforeToolCallRequest{Call: &turnwirev1.ToolCallInfo{ToolName: "delete"}}, nil),
			call(5, &turnwirev1.OnChatErrorRequest{}, nil),
		}},
	}
	for _, request := range requests {
		if err := stream.Send(request); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var answers []*turnwirev1.HookAnswer
	for {
		response, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		answers = append(answers, response.GetAnswers()...)
	}
	if len(answers) != 5 {
		t.Fatalf("%d answers; want 5: %v", len(answers), answers)
	}
	for i, answer := range answers {
		if answer.GetId() != uint64(i+1) {
			t.Fatalf("answer %d answers call %d; want the calls' order", i, answer.GetId())
		}
	}
	// The stream's metadata and the call's own trace context, as on a unary RPC.
	if got := answers[0].GetBeforeTurn().GetSystem(); got != "r-1|"+traceparent+"|acme" {
		t.Errorf("BeforeTurn saw metadata %q", got)
	}
	if answers[1].GetAfterToolCall() == nil || wait(t, observed, "AfterToolCall") != "echo" {
		t.Errorf("AfterToolCall: %v", answers[1])
	}
	// A failed call is an error answer, and the stream goes on.
	if e := answers[2].GetError(); codes.Code(e.GetCode()) != codes.PermissionDenied || e.GetMessage() != "not this tenant" || answers[2].GetHook() != nil {
		t.Errorf("the failing BeforeTurn: %v", answers[2])
	}
	if answers[3].GetBeforeToolCall().GetBlock().GetReason() != "delete is disabled" {
		t.Errorf("BeforeToolCall: %v", answers[3])
	}
	if codes.Code(answers[4].GetError().GetCode()) != codes.Unimplemented {
		t.Errorf("a hook not implemented: %v; want an Unimplemented error answer", answers[4])
	}
}

func TestACancelledHookCallCancelsItsHandler(t *testing.T) {
	started, cancelled := make(chan struct{}), make(chan error, 2)
	hooks := &kit.Hooks{BeforeTurn: func(ctx context.Context, _ *turnwirev1.BeforeTurnRequest) (*turnwirev1.BeforeTurnResponse, error) {
		started <- struct{}{}
		<-ctx.Done()
		cancelled <- ctx.Err()
		return nil, ctx.Err()
	}}
	client := turnwirev1.NewTurnHooksServiceClient(serve(t, hooks))

	// A unary call past its deadline (the sidecar's deadline_seconds).
	ctx, cancel := context.WithTimeout(testContext(t), 200*time.Millisecond)
	defer cancel()
	if _, err := client.BeforeTurn(ctx, &turnwirev1.BeforeTurnRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("BeforeTurn: %v; want DeadlineExceeded", err)
	}
	wait(t, started, "start")
	// Its own deadline or the caller's cancellation, whichever the server sees first.
	if err := wait(t, cancelled, "cancellation"); err == nil {
		t.Errorf("the handler's context did not end")
	}

	// A HookSession the sidecar cancels (a call's deadline breaks it).
	ctx, cancel = context.WithCancel(testContext(t))
	defer cancel()
	stream, err := client.HookSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&turnwirev1.HookSessionRequest{Calls: []*turnwirev1.HookCall{
		{Id: 1, Hook: &turnwirev1.HookCall_BeforeTurn{BeforeTurn: &turnwirev1.BeforeTurnRequest{}}},
	}}); err != nil {
		t.Fatal(err)
	}
	wait(t, started, "start")
	cancel()
	if err := wait(t, cancelled, "cancellation"); !errors.Is(err, context.Canceled) {
		t.Errorf("the session handler's context ended with %v", err)
	}
}

func TestOnChunksReadsBatchesInOrder(t *testing.T) {
	seen := make(chan []string, 2)
	hooks := &kit.Hooks{OnChunks: func(_ context.Context, chunks *kit.Chunks) error {
		deltas := []string{chunks.Turn().GetRequestId()}
		for chunks.Next() {
			for _, event := range chunks.Events() {
				deltas = append(deltas, event.GetTextDelta().GetDelta())
			}
			if deltas[len(deltas)-1] == "stop" {
				break // the kit reads and drops the rest
			}
		}
		seen <- deltas
		return chunks.Err()
	}}
	client := turnwirev1.NewTurnHooksServiceClient(serve(t, hooks))
	delta := func(text string) *turnwirev1.TurnEvent {
		return &turnwirev1.TurnEvent{Event: &turnwirev1.TurnEvent_TextDelta{TextDelta: &turnwirev1.TextDelta{Delta: text}}}
	}
	for _, batches := range [][][]string{{{"a", "b"}, {"c"}, {"d"}}, {{"a", "stop"}, {"never read"}}} {
		stream, err := client.OnChunks(testContext(t))
		if err != nil {
			t.Fatal(err)
		}
		for i, batch := range batches {
			request := &turnwirev1.OnChunksRequest{}
			if i == 0 {
				request.Turn = &turnwirev1.TurnInfo{RequestId: "r-7"}
			}
			for _, text := range batch {
				request.Events = append(request.Events, delta(text))
			}
			if err := stream.Send(request); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := stream.CloseAndRecv(); err != nil {
			t.Fatalf("OnChunks: %v", err)
		}
		want := []string{"r-7"}
		for _, batch := range batches {
			want = append(want, batch...)
			if batch[len(batch)-1] == "stop" {
				break
			}
		}
		if got := wait(t, seen, "the handler's end"); !reflect.DeepEqual(got, want) {
			t.Errorf("the handler read %v; want %v", got, want)
		}
	}
}
