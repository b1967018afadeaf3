// Package turnwire is a thin Go client of the Turnwire sidecar
// (turnwire.v1.ChatService).
//
// It adds to the generated gRPC code (package turnwire.dev/go/gen/turnwire/v1,
// imported as turnwirev1) only what a caller would otherwise write by hand:
//
//   - Dial, whose connection returns every failed call as an *Error with the
//     google.rpc details Turnwire sends (ErrorInfo reason, BadRequest field
//     violations, RetryInfo delay) already decoded;
//   - Stream, an iterator over one turn's events (Next/Event/Err) for the
//     turn-running RPCs; cancelling the context, or Close, cancels the call
//     and, under DISCONNECT_POLICY_CANCEL (the default), the turn;
//   - ToolInput and ToolOutput, which turn the JSON text of tool calls into
//     plain Go values with exact numbers, and UserText, the usual request
//     message.
//
// Every other RPC is called through Client.Service, the generated client on
// the same connection. Requests and events are the generated types.
//
// The package builds with the Go toolchain and libraries of Debian 12
// (Go 1.19, gRPC-Go 1.33, google.golang.org/protobuf 1.28); see the README.
package turnwire
