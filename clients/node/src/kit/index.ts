// @turnwire/client/kit: write a hook server and a tool host for the Turnwire sidecar in
// TypeScript (Node.js only; docs/api/kit-typescript.md). `hooks({...})` serves TurnHooksService
// from typed handlers, `defineTool({...})` a tool of ToolExecutorService, `serve({hooks, tools})`
// both on one gRPC server.

export { allow, allowWithInput, block, hooks, substitute } from './hooks.js';
export type {
  AfterToolCallCall,
  BeforeStepCall,
  BeforeToolCallCall,
  BeforeToolCallContext,
  BeforeTurnCall,
  ClassifyChatErrorCall,
  Failure,
  HookContext,
  HookHandlers,
  HookOptions,
  HookServer,
  ObservableHook,
  OnChatErrorCall,
  OnChatResponseCall,
  OnStepFinishCall,
  Turn,
} from './hooks.js';
export { defineTool, toolHost } from './tools.js';
export type { Tool, ToolContext, ToolDefinition, ToolHost } from './tools.js';
export { serve } from './serve.js';
export type { Served, ServeOptions } from './serve.js';
export { TOOL_EXECUTOR_SERVICE, TURN_HOOKS_SERVICE } from './grpc.js';
export { PARENT_REQUEST_ID } from '../calls.js';
export { parseKitJson, stringifyKitJson } from './json.js';
export type { KitJson, KitJsonObject } from './json.js';
export { ChatErrorClassification, Hook, ToolCallOutcome, TurnOutcome } from '../gen/turnwire/v1/hooks_pb.js';
export type {
  AfterToolCallRequest,
  BeforeStepRequest,
  BeforeToolCallRequest,
  BeforeTurnRequest,
  ChatErrorInfo,
  ClassifyChatErrorRequest,
  OnChatErrorRequest,
  OnChatResponseRequest,
  OnChunksRequest,
  OnStepFinishRequest,
  TurnInfo,
} from '../gen/turnwire/v1/hooks_pb.js';
