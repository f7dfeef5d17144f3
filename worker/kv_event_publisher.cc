#include "worker/kv_event_publisher.h"

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/server/authorized.h"
#include "common/server/raw_call.h"
#include "common/server/stream_sink.h"

namespace tandem {
namespace {

uint64_t RandomInstanceId() {
  absl::BitGen gen;
  uint64_t id = 0;
  while (id == 0) id = absl::Uniform<uint64_t>(gen);
  return id;
}

void AddEvent(v1::KvBlockEvent::Kind kind, uint64_t hi, uint64_t lo, v1::KvEventBatch* batch) {
  v1::KvBlockEvent* e = batch->add_events();
  e->set_kind(kind);
  e->mutable_hash()->set_hi(hi);
  e->mutable_hash()->set_lo(lo);
}

// A Watch stream as an outlet.
class SinkOutlet : public KvEventOutlet {
 public:
  explicit SinkOutlet(std::shared_ptr<rpc::StreamSink<v1::KvEventBatch>> sink)
      : sink_(std::move(sink)) {}
  bool Write(const v1::KvEventBatch& batch) override { return sink_->Write(batch); }
  size_t Queued() override { return sink_->Queued(); }
  void Finish(const grpc::Status& status) override { sink_->Finish(status); }

 private:
  std::shared_ptr<rpc::StreamSink<v1::KvEventBatch>> sink_;
};

}  // namespace

class KvEventPublisher::Service
    : public v1::KvEvents::WithRawCallbackMethod_Watch<v1::KvEvents::CallbackService> {
 public:
  explicit Service(KvEventPublisher* publisher) : publisher_(publisher) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Watch(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request) override {
    return rpc::AuthorizedStream<v1::WatchKvEventsRequest>(
        publisher_->options_.auth, context, rpc::kKvEventsWatchMethod, request,
        [&](const v1::WatchKvEventsRequest*) {
          // A cancelled watch (the client left, the server shuts down) is
          // finished at once; the publisher prunes it on its next batch
          // (its sink's Write answers false). The cancel may come before
          // the sink is known here: `link` settles that race.
          struct Link {
            absl::Mutex mu;
            std::weak_ptr<rpc::StreamSink<v1::KvEventBatch>> sink;
            bool cancelled = false;
          };
          auto link = std::make_shared<Link>();
          const grpc::Status cancelled(grpc::StatusCode::CANCELLED, "watch cancelled");
          auto [reactor, sink] = rpc::StreamSink<v1::KvEventBatch>::Create(
              [link, cancelled] {
                std::shared_ptr<rpc::StreamSink<v1::KvEventBatch>> s;
                {
                  absl::MutexLock lock(&link->mu);
                  link->cancelled = true;
                  s = link->sink.lock();
                }
                if (s != nullptr) s->Finish(cancelled);
              },
              context);
          bool already_cancelled;
          {
            absl::MutexLock lock(&link->mu);
            link->sink = sink;
            already_cancelled = link->cancelled;
          }
          if (already_cancelled) {
            sink->Finish(cancelled);
          } else {
            publisher_->Subscribe(std::make_shared<SinkOutlet>(sink));
          }
          return reactor;
        });
  }

 private:
  KvEventPublisher* const publisher_;
};

KvEventPublisher::KvEventPublisher(const KvEventPublisherOptions& options)
    : options_(options),
      instance_id_(options.instance_id != 0 ? options.instance_id : RandomInstanceId()),
      service_(std::make_unique<Service>(this)) {}

KvEventPublisher::~KvEventPublisher() {
  absl::MutexLock lock(&mu_);
  for (const auto& s : subscribers_) {
    s->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is shutting down"));
  }
}

void KvEventPublisher::Publish(std::vector<kv::KvCacheEvent> events) {
  if (events.empty()) return;
  absl::MutexLock lock(&mu_);
  v1::KvEventBatch batch;
  batch.set_instance_id(instance_id_);
  batch.set_block_size(static_cast<uint32_t>(options_.block_size));
  batch.set_sequence(last_sequence_ + 1);
  for (const kv::KvCacheEvent& e : events) {
    const HashKey key{e.hash.hi, e.hash.lo};
    if (e.kind == kv::KvCacheEvent::Kind::kStored) {
      cached_.insert(key);
      AddEvent(v1::KvBlockEvent::STORED, key.hi, key.lo, &batch);
    } else {
      cached_.erase(key);
      AddEvent(v1::KvBlockEvent::REMOVED, key.hi, key.lo, &batch);
    }
  }
  last_sequence_ += events.size();
  FanOutLocked(batch);
}

void KvEventPublisher::FanOutLocked(const v1::KvEventBatch& batch) {
  std::vector<std::shared_ptr<KvEventOutlet>> kept;
  kept.reserve(subscribers_.size());
  for (std::shared_ptr<KvEventOutlet>& s : subscribers_) {
    if (s->Queued() >= options_.max_queued_batches) {
      // Never wait for a slow watcher: its stream ends (what it has queued
      // still goes out) and it misses this batch and every later one, a gap
      // it sees as the end of the stream.
      s->Finish(
          grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       absl::StrCat("KV event watcher fell behind (", options_.max_queued_batches,
                                    " batches unsent): events from sequence ", batch.sequence(),
                                    " on are lost; watch again for a snapshot")));
      continue;
    }
    if (s->Write(batch)) kept.push_back(std::move(s));
  }
  subscribers_.swap(kept);
}

void KvEventPublisher::Subscribe(std::shared_ptr<KvEventOutlet> outlet) {
  absl::MutexLock lock(&mu_);
  v1::KvEventBatch snapshot;
  snapshot.set_instance_id(instance_id_);
  snapshot.set_block_size(static_cast<uint32_t>(options_.block_size));
  snapshot.set_snapshot(true);
  snapshot.set_sequence(last_sequence_);
  for (const HashKey& key : cached_) AddEvent(v1::KvBlockEvent::STORED, key.hi, key.lo, &snapshot);
  if (outlet->Write(snapshot)) subscribers_.push_back(std::move(outlet));
}

uint64_t KvEventPublisher::last_sequence() const {
  absl::MutexLock lock(&mu_);
  return last_sequence_;
}

size_t KvEventPublisher::num_cached() const {
  absl::MutexLock lock(&mu_);
  return cached_.size();
}

size_t KvEventPublisher::num_subscribers() const {
  absl::MutexLock lock(&mu_);
  return subscribers_.size();
}

grpc::Service* KvEventPublisher::service() { return service_.get(); }

}  // namespace tandem
