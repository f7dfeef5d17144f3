// A server-streaming callback reactor fed from any thread.
//
// gRPC's callback API allows one outstanding write per stream and requires
// exactly one Finish(). StreamSink queues messages written by producer
// threads (an engine loop, a router request thread) and drives the reactor:
// one write in flight, Finish after the queue drains, and a cancel callback
// when the client goes away.
//
// The reactor is a raw one (grpc::ServerWriteReactor<grpc::ByteBuffer>, for
// methods registered with WithRawCallbackMethod_*; raw_call.h): Write
// serializes each Msg on the producer's thread.
//
// Trailing metadata: Finish(status, trailers) on a sink created with the
// call's server context (Create's `context`), e.g. the router's
// retry-after-ms on RESOURCE_EXHAUSTED.
//
// Threads: Write/Finish/IsOpen are thread-safe. The reactor's callbacks run
// on gRPC threads and only touch the sink under its mutex.
// Lifetime: the reactor deletes itself in OnDone; the sink is shared and
// outlives it (producers holding a sink after OnDone get Write() == false).
#ifndef TANDEM_COMMON_SERVER_STREAM_SINK_H_
#define TANDEM_COMMON_SERVER_STREAM_SINK_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_callback.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/server/raw_call.h"

namespace tandem::rpc {

// Streams of this process whose Finish was called but whose status has not
// gone out yet (the reactor's OnDone has not run), every StreamSink type
// together.
inline std::atomic<int64_t> g_finishing_streams{0};

// FinishingStreams() == 0 means every stream that was ended has sent its
// status. A server waits for it (bounded) before grpc::Server::Shutdown,
// which would cancel the calls still sending theirs: the client would read
// CANCELLED instead of the reason (e.g. "device lost: ...").
inline int64_t FinishingStreams() { return g_finishing_streams.load(); }

template <class Msg>
class StreamSink : public std::enable_shared_from_this<StreamSink<Msg>> {
 public:
  // Creates a reactor bound to a new sink; return the reactor from the
  // service method. on_cancel runs once (gRPC thread) if the client
  // cancels or the deadline passes; the producer must still call Finish.
  // `context`: the call's, needed only by Finish with trailers (it stays
  // valid until the reactor's OnDone, i.e. while the sink is unfinished).
  static std::pair<grpc::ServerWriteReactor<grpc::ByteBuffer>*, std::shared_ptr<StreamSink>> Create(
      std::function<void()> on_cancel, grpc::CallbackServerContext* context = nullptr) {
    auto sink = std::shared_ptr<StreamSink>(new StreamSink());
    sink->on_cancel_ = std::move(on_cancel);
    sink->context_ = context;
    auto* reactor = new Reactor(sink);
    {
      absl::MutexLock lock(&sink->mu_);
      sink->reactor_ = reactor;
    }
    return {reactor, sink};
  }

  // Queues a message. Returns false (dropping it) once the stream is
  // finished, broken or cancelled; a message that cannot be serialized
  // finishes the stream with INTERNAL.
  bool Write(const Msg& msg) {
    grpc::ByteBuffer buffer;
    if (grpc::Status s = SerializeToBuffer(msg, &buffer); !s.ok()) {
      Finish(s);
      return false;
    }
    Reactor* start = nullptr;
    const grpc::ByteBuffer* front = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || broken_ || finish_.has_value()) return false;
      pending_.push_back(std::move(buffer));
      if (!writing_) {
        writing_ = true;
        start = reactor_;
        front = &pending_.front();
      }
    }
    // Only the thread that set writing_ may start a write; the reactor cannot
    // be finished meanwhile because Finish waits for writing_ == false.
    if (start != nullptr) start->StartWrite(front);
    return true;
  }

  // (key, value) pairs of trailing metadata; keys lowercase ASCII.
  using Trailers = std::vector<std::pair<std::string, std::string>>;

  // Ends the stream with `status` and `trailers` after the queued messages
  // (dropped if the stream broke). Later calls are ignored. Trailers on a
  // sink created without a context are a programming error: the stream
  // ends with INTERNAL saying so instead.
  void Finish(grpc::Status status, Trailers trailers = {}) {
    if (!trailers.empty() && context_ == nullptr) {
      status = grpc::Status(grpc::StatusCode::INTERNAL,
                            "StreamSink: trailers need the call's context (Create)");
      trailers.clear();
    }
    Reactor* finish = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (finish_.has_value() || reactor_ == nullptr) return;
      finish_ = status;
      g_finishing_streams.fetch_add(1);
      trailers_ = std::move(trailers);
      if (!writing_) {
        finish = reactor_;
        finish_started_ = true;
        AddTrailersLocked();
      }
    }
    if (finish != nullptr) finish->Finish(status);
  }

  // Messages written and not yet sent (the one being written included):
  // lets a producer bound what a slow client makes it hold.
  size_t Queued() {
    absl::MutexLock lock(&mu_);
    return pending_.size();
  }

  // False once cancelled, broken or finished.
  bool IsOpen() {
    absl::MutexLock lock(&mu_);
    return reactor_ != nullptr && !broken_ && !cancelled_ && !finish_.has_value();
  }

 private:
  class Reactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
   public:
    explicit Reactor(std::shared_ptr<StreamSink> sink) : sink_(std::move(sink)) {}
    void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
    void OnCancel() override { sink_->OnCancel(); }
    void OnDone() override {
      sink_->OnDone();
      delete this;
    }

   private:
    std::shared_ptr<StreamSink> sink_;
  };

  StreamSink() = default;

  void OnWriteDone(bool ok) {
    Reactor* start = nullptr;
    const grpc::ByteBuffer* front = nullptr;
    bool finish = false;
    grpc::Status finish_status;
    {
      absl::MutexLock lock(&mu_);
      pending_.pop_front();
      if (!ok) {
        broken_ = true;
        pending_.clear();
      }
      if (!pending_.empty()) {
        start = reactor_;
        front = &pending_.front();
      } else {
        writing_ = false;
        if (finish_.has_value() && !finish_started_) {
          finish_started_ = true;
          finish = true;
          finish_status = *finish_;
          start = reactor_;
          AddTrailersLocked();
        }
      }
    }
    if (start == nullptr) return;
    if (finish) {
      start->Finish(finish_status);
    } else {
      start->StartWrite(front);
    }
  }

  // Hands the trailers to the context; once, just before the reactor's
  // Finish (nothing else touches the context's trailers).
  void AddTrailersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& [key, value] : trailers_) context_->AddTrailingMetadata(key, value);
    trailers_.clear();
  }

  void OnCancel() {
    std::function<void()> cb;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      cb = std::move(on_cancel_);
    }
    if (cb) cb();
  }

  void OnDone() {
    absl::MutexLock lock(&mu_);
    if (finish_.has_value()) g_finishing_streams.fetch_sub(1);
    reactor_ = nullptr;
    on_cancel_ = nullptr;
  }

  absl::Mutex mu_;
  Reactor* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<grpc::ByteBuffer> pending_ ABSL_GUARDED_BY(mu_);  // serialized messages
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
  grpc::CallbackServerContext* context_ = nullptr;  // set once by Create
  Trailers trailers_ ABSL_GUARDED_BY(mu_);          // until AddTrailersLocked
};

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_SERVER_STREAM_SINK_H_
