// Package kit writes Turnwire hook servers and tool hosts in Go: typed
// handlers for the lifecycle hooks you implement (Hooks) and typed tools
// (Tool), served on one gRPC server (Serve, or Register on a server of your
// own). docs/api/kit-go.md shows a policy hook and a tool host.
//
// It serves the two services the sidecar calls (protos/turnwire/v1):
//
//   - turnwire.v1.TurnHooksService: GetHookSubscriptions answers the hooks
//     whose handler is set and offers the HookSession stream; each hook is
//     served both as its unary RPC and on HookSession (the sidecar's config
//     picks, docs/hooks.md), by the same handler. OnChunks too: its RPC, or
//     on HookSession a turn's batches (hook_session_chunks), fed to one
//     handler call per turn. Errors and panics become the failed call the
//     sidecar applies its failure mode to. Hooks.Observe declares the hooks
//     the server only observes (observed_hooks): the sidecar does not wait
//     for the deciding ones on HookSession and ignores their answers; for
//     the end hooks (OnChatResponse, OnChatError) it sends TurnEnd without
//     waiting for the server, which still gets their call, in order, after
//     the turn's other calls. The kit answers a change an observed handler
//     returns as no change.
//   - turnwire.v1.ToolExecutorService: ListTools lists the tools with JSON
//     Schemas derived from their Go input types and a new instance id per
//     process; ExecuteTool decodes the input (integers exact), runs the tool
//     with a context the sidecar's cancellation cancels, streams its
//     preliminary results in order and ends with its result, or with its error
//     as a tool error the model reads (docs/tools.md).
//
// Like package turnwire it builds with Debian 12's Go 1.19 and gRPC-Go 1.33.
package kit
