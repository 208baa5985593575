// Where gRPC puts a unary grad call's request and response messages.
//
// Note [Unary messages on an arena]
// gRPC's default message holder places a unary call's request and response objects in the
// call's arena, but everything they own (the graph's ops, names, shapes, the tensors, the
// response's gradients) on the heap: dozens of small allocations per grad call, each freed
// again when the call ends, which is a fair share of a small request's cost. This allocator
// gives each call a protobuf Arena whose first block is part of the holder, so a small
// request is parsed, and its response built, without further allocations, and all of it is
// freed at once when gRPC releases the holder after the call is done. A larger message
// grows the arena by ordinary heap blocks; bytes fields (tensor data) keep their own buffers
// either way. A released holder, its arena emptied, is kept for reuse by the thread that
// released it (a few per thread), since a fresh 8 KiB block costs more to allocate than a
// small request costs to parse. Only ComputeGradients uses it; streamed calls own their
// messages.

#ifndef GRADSERVE_SERVER_UNARY_MESSAGES_H_
#define GRADSERVE_SERVER_UNARY_MESSAGES_H_

#include "gradserve/v1/gradserve.pb.h"
#include "grpcpp/support/message_allocator.h"

namespace gradserve::server {

// Thread safety: AllocateMessages may be called from any thread at once. Must outlive every
// call of the server it is registered with.
class ArenaMessageAllocator final
    : public grpc::MessageAllocator<v1::GradRequest, v1::GradResponse> {
 public:
  grpc::MessageHolder<v1::GradRequest, v1::GradResponse>* AllocateMessages() override;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_UNARY_MESSAGES_H_
