#include "tdist/detail/comm/engine/same_host.h"

#include <algorithm>
#include <cstring>

#include "tdist/error.h"

namespace tdist::detail {

namespace {

enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kAllToAll };

// Fold blocks: small enough that a block's partial result stays in the core's cache between
// the fold and its copies out, large enough that the loop amortises (direct reads across
// processes take one kernel call per block, hence the larger blocks there).
constexpr int64_t kStagedFoldBytes = int64_t(64) << 10;
constexpr int64_t kDirectFoldBytes = int64_t(256) << 10;

struct OpArgs {
  Kind kind = Kind::kAllReduce;
  ElementSpan in, out;
  FoldFn fold;
  FinishFn finish;
  SameHostOp::BlockPlacer place;
  int root = -1;
};

// Pieces cover elements [begin, begin + len) of the op's domain: the buffer (all_reduce,
// broadcast), the input (all_gather), or the same range of every rank's block
// (reduce_scatter: domain = output numel; all_to_all: domain = block numel).
class Op final : public SameHostOp {
 public:
  Op(SameHostChannel& channel, OpArgs args)
      : ch_(channel),
        kind_(args.kind),
        in_(static_cast<char*>(args.in.data)),
        out_(static_cast<char*>(args.out.data)),
        in_bytes_(args.in.bytes()),
        out_bytes_(args.out.bytes()),
        fold_(std::move(args.fold)),
        finish_(std::move(args.finish)),
        place_(std::move(args.place)),
        root_(args.root),
        es_(static_cast<int64_t>(args.in.element_size)),
        staged_(static_cast<size_t>(channel.size()), 0) {
    const int n = ch_.size();
    const bool blocked = kind_ == Kind::kReduceScatter || kind_ == Kind::kAllToAll;
    domain_ = kind_ == Kind::kReduceScatter ? args.out.numel
              : kind_ == Kind::kAllToAll    ? args.in.numel / n
                                            : args.in.numel;
    piece_elems_ = std::max<int64_t>(1, ch_.piece_bytes() / (blocked ? n * es_ : es_));
    if (domain_ > 0) choose_path();
    // Note [Placed all-gather over shared memory]: one direct step hands each peer's block to
    // the placer where it lives, and so does a staged op of one piece, from the halves; staged
    // pieces gather rank-major into a scratch buffer first, placed from there once complete.
    place_from_halves_ = place_ && !direct_ && piece_elems_ >= domain_;
    if (place_ && !direct_ && !place_from_halves_) {
      gathered_.reset(new char[static_cast<size_t>(n * domain_ * es_)]);
      out_ = gathered_.get();
    }
  }

  bool advance(bool& progressed) override {
    while (true) {
      switch (step(progressed)) {
        case Step::kBlocked:
          return false;
        case Step::kFinished:
          return true;
        case Step::kNext:
          break;
      }
    }
  }

  bool fell_back() const override { return fell_back_; }

 private:
  enum class Stage { kBegin, kArrived, kReduced, kDirectArrived, kDirectDone, kDirectFinal };
  enum class Step { kNext, kBlocked, kFinished };

  // Peers read my input where they can (all_gather: it was usually written long ago, and
  // moving lines another core has just written is what costs most between cores); else, for
  // all_gather, my block of the output when only it is symmetric, filled before I announce
  // it; plain tensors only when the channel lets peers read them. The choice depends only on
  // what every rank shares, so ranks agree unless symmetric memory is on some of them only.
  void choose_path() {
    if (kind_ == Kind::kBroadcast || kind_ == Kind::kAllToAll) return;
    const int n = ch_.size();
    shared_bytes_ = in_bytes_;
    sym_ = find_symmetric(in_, shared_bytes_);
    if (kind_ == Kind::kAllGather && sym_.id == 0 && !place_) {
      const SymmetricRef block = find_symmetric(out_at(ch_.rank() * domain_), shared_bytes_);
      if (block.id != 0) {
        announce_output_ = true;
        sym_ = block;
      }
    }
    // (A placed all-gather's size is its peers' output size, so every rank picks one path.)
    const int64_t op_bytes = static_cast<int64_t>(place_ ? in_bytes_ * static_cast<size_t>(n)
                                                         : std::max(in_bytes_, out_bytes_));
    direct_ = sym_.id != 0 || ch_.reads_plain_tensors(op_bytes, kind_ == Kind::kAllReduce);
  }

  // Staged pieces: kBegin -> kArrived (-> kReduced for all_reduce) -> kBegin, per piece.
  // Direct: kBegin -> kDirectArrived -> kDirectDone (-> kDirectFinal for all_reduce), once.
  Step step(bool& progressed) {
    switch (stage_) {
      case Stage::kBegin:
        return begin_next(progressed);
      case Stage::kArrived:
        return consume_arrived(progressed);
      case Stage::kReduced:
        return copy_out_reduced(progressed);
      case Stage::kDirectArrived:
        return read_announced(progressed);
      case Stage::kDirectDone:
        return finish_direct_reads(progressed);
      case Stage::kDirectFinal:
        return await_copies();
    }
    return Step::kNext;
  }

  Step begin_next(bool& progressed) {
    const bool empty_piece_due = pieces_ == 0 && ch_.runs_empty_ops();
    if (begin_ >= domain_ && !empty_piece_due) {
      if (place_ && !direct_ && (pieces_ == 0 || !place_from_halves_)) place_every_block();
      return Step::kFinished;
    }
    ++pieces_;
    progressed = true;
    k_ = 0;
    if (direct_) {
      begin_direct();
      stage_ = Stage::kDirectArrived;
      return Step::kNext;
    }
    if (!begin_piece()) {
      fell_back_ = true;
      return Step::kFinished;
    }
    stage_ = Stage::kArrived;
    return Step::kNext;
  }

  // ---- staged pieces ----

  // Fills my half and arrives; false when the op falls back.
  bool begin_piece() {
    const int n = ch_.size(), r = ch_.rank();
    len_ = std::min(piece_elems_, domain_ - begin_);
    seq_ = ch_.take_seq();
    for (int p = 0; p < n; ++p) staged_[static_cast<size_t>(p)] = staged_bytes(p);
    char* mine = ch_.my_half(seq_, staged_[static_cast<size_t>(r)]);
    if (mine != nullptr) stage_into(mine);
    // My own part while I wait for the peers (a blocking arrival), or while they copy theirs
    // in. (A placer is called once per block: not before an arrival that may fall back.)
    const bool own_first = ch_.arrival_blocks() && !place_;
    if (own_first) own_part();
    PieceAnnouncement me;
    if (!ch_.arrive(seq_, me, staged_)) return false;
    if (!own_first) own_part();
    return true;
  }

  // What rank p stages for the current piece.
  size_t staged_bytes(int p) const {
    const size_t piece = static_cast<size_t>(len_ * es_);
    switch (kind_) {
      case Kind::kReduceScatter:
      case Kind::kAllToAll:
        return piece * static_cast<size_t>(ch_.size());
      case Kind::kBroadcast:
        return p == root_ ? piece : 0;
      default:
        return piece;
    }
  }

  void stage_into(char* mine) {
    const int n = ch_.size(), r = ch_.rank();
    switch (kind_) {
      case Kind::kAllReduce:
        for (int j = 0; j < n; ++j) {
          if (j == r) continue;  // my chunk's slot: the fold's accumulator
          copy(mine + chunk_begin(j) * es_, in_at(begin_ + chunk_begin(j)), chunk_len(j));
        }
        return;
      case Kind::kReduceScatter:
      case Kind::kAllToAll:
        for (int j = 0; j < n; ++j) {
          if (j != r) copy(mine + j * len_ * es_, in_at(j * domain_ + begin_), len_);
        }
        return;
      case Kind::kAllGather:
        copy(mine, in_at(begin_), len_);
        return;
      case Kind::kBroadcast:
        if (r == root_) copy(mine, in_at(begin_), len_);
        return;
    }
  }

  void own_part() {
    const int r = ch_.rank();
    if (kind_ == Kind::kAllGather && place_from_halves_) place_(r, in_at(0));
    if (kind_ == Kind::kAllGather && !place_from_halves_) {
      copy(out_at(r * domain_ + begin_), in_at(begin_), len_);
    }
    if (kind_ == Kind::kAllToAll) {
      copy(out_at(r * domain_ + begin_), in_at(r * domain_ + begin_), len_);
    }
  }

  // Every rank's part of this piece is in its half: copy it as it arrives, or once all have,
  // fold it.
  Step consume_arrived(bool& progressed) {
    const int n = ch_.size(), r = ch_.rank();
    for (; k_ < n; ++k_) {
      if (k_ == r) continue;
      // (broadcast: the root too waits for every arrival, which proves each peer has finished
      // reading the root's half of the piece before last)
      if (!ch_.wait(k_, PiecePhase::kArrived, seq_, "copied its input in")) return Step::kBlocked;
      check_same_path(k_);
      copy_arrived(k_);
      progressed = true;
    }
    if (kind_ == Kind::kAllReduce) {
      fold_staged_chunk();
      ch_.signal(PiecePhase::kReduced, seq_);
      stage_ = Stage::kReduced;
      k_ = 0;
      return Step::kNext;
    }
    if (kind_ == Kind::kReduceScatter) fold_staged_block();
    begin_ += len_;
    stage_ = Stage::kBegin;
    return Step::kNext;
  }

  void copy_arrived(int k) {
    const int r = ch_.rank();
    const char* half = ch_.peer_half(k, seq_);
    switch (kind_) {
      case Kind::kAllGather:
        if (place_from_halves_) {
          place_(k, half);
        } else {
          copy(out_at(k * domain_ + begin_), half, len_);
        }
        return;
      case Kind::kAllToAll:
        copy(out_at(k * domain_ + begin_), half + r * len_ * es_, len_);
        return;
      case Kind::kBroadcast:
        if (k == root_) copy(in_at(begin_), half, len_);
        return;
      default:
        return;  // reductions fold once every rank has arrived
    }
  }

  // all_reduce: chunk r of the piece folded in rank order into my own chunk's slot of my half
  // (the copy-in skipped it; peers copy it out of there) and into my tensor.
  void fold_staged_chunk() {
    const int r = ch_.rank();
    const int64_t first = chunk_begin(r);
    char* slot = const_cast<char*>(ch_.peer_half(r, seq_)) + first * es_;
    auto source = [&](int p, int64_t at) -> const char* {
      return p == r ? in_at(begin_ + first) + at : ch_.peer_half(p, seq_) + first * es_ + at;
    };
    fold_blocks(chunk_len(r), kStagedFoldBytes, slot, source, in_at(begin_ + first));
  }

  // reduce_scatter: my output's piece = block r of every rank's piece, in rank order.
  void fold_staged_block() {
    const int r = ch_.rank();
    auto source = [&](int p, int64_t at) -> const char* {
      return p == r ? in_at(r * domain_ + begin_) + at
                    : ch_.peer_half(p, seq_) + r * len_ * es_ + at;
    };
    fold_blocks(len_, kStagedFoldBytes, out_at(begin_), source);
  }

  // dst[0, count) = every rank's source folded in rank order, block by block, each block
  // finished once complete and copied to `also` (when given) while it is in cache. Steps
  // before the last write dst itself: no source aliases it.
  template <typename Source>
  void fold_blocks(int64_t count, int64_t block_bytes, char* dst, Source&& source,
                   char* also = nullptr) {
    const int n = ch_.size();
    const int64_t per_block = std::max<int64_t>(1, block_bytes / es_);
    for (int64_t done = 0; done < count; done += per_block) {
      const int64_t k = std::min(per_block, count - done);
      const int64_t at = done * es_;
      char* out = dst + at;
      fold_(out, source(0, at), source(1, at), static_cast<size_t>(k));
      for (int p = 2; p < n; ++p) fold_(out, out, source(p, at), static_cast<size_t>(k));
      if (finish_) finish_(out, static_cast<size_t>(k));
      if (also != nullptr) copy(also + at, out, k);
    }
  }

  // all_reduce: every rank has published its reduced chunk of this piece: copy them out.
  Step copy_out_reduced(bool& progressed) {
    const int n = ch_.size(), r = ch_.rank();
    for (; k_ < n; ++k_) {
      if (k_ == r) continue;
      if (!ch_.wait(k_, PiecePhase::kReduced, seq_, "published its reduced chunk")) {
        return Step::kBlocked;
      }
      copy(in_at(begin_ + chunk_begin(k_)), ch_.peer_half(k_, seq_) + chunk_begin(k_) * es_,
           chunk_len(k_));
      progressed = true;
    }
    begin_ += len_;
    stage_ = Stage::kBegin;
    return Step::kNext;
  }

  // ---- direct: the whole op as one piece ----

  void begin_direct() {
    const int r = ch_.rank();
    len_ = domain_;
    seq_ = ch_.take_seq();
    // all_reduce has a third phase, with a sequence number of its own.
    if (kind_ == Kind::kAllReduce) done_seq_ = ch_.take_seq();
    // My own block while I wait for the peers (a blocking arrival), or while they read mine;
    // before announcing it when it is what they read.
    const bool own_first = ch_.arrival_blocks();
    if (kind_ == Kind::kAllGather && place_) {
      if (own_first) place_(r, in_at(0));
      arrive_direct();
      if (!own_first) place_(r, in_at(0));
      return;
    }
    const bool own_copy = kind_ == Kind::kAllGather && out_at(r * domain_) != in_at(0);
    const bool copy_first = own_copy && (announce_output_ || own_first);
    if (copy_first) copy(out_at(r * domain_), in_at(0), domain_);
    arrive_direct();
    if (own_copy && !copy_first) copy(out_at(r * domain_), in_at(0), domain_);
  }

  void arrive_direct() {
    PieceAnnouncement me;
    me.direct = true;
    me.symmetric = sym_;
    me.address =
        reinterpret_cast<uintptr_t>(announce_output_ ? out_at(ch_.rank() * domain_) : in_at(0));
    std::fill(staged_.begin(), staged_.end(), 0);
    if (!ch_.arrive(seq_, me, staged_)) {
      TDIST_THROW(DistBackendError, ch_.describe() + ": a direct op cannot fall back");
    }
  }

  // Every rank has announced its tensor: gather from them, then fold my chunk.
  Step read_announced(bool& progressed) {
    const int n = ch_.size(), r = ch_.rank();
    for (; k_ < n; ++k_) {
      if (k_ == r) continue;
      if (!ch_.wait(k_, PiecePhase::kArrived, seq_, "announced its tensor")) return Step::kBlocked;
      check_same_path(k_);
      if (kind_ == Kind::kAllGather) {
        if (place_) {
          place_(k_, bytes_of(k_, 0, domain_ * es_, ch_.scratch(1)));
        } else {
          copy_from(k_, 0, out_at(k_ * domain_), domain_ * es_);
        }
      }
      progressed = true;
    }
    if (kind_ == Kind::kAllReduce) {
      fold_direct(chunk_begin(r), chunk_len(r), in_at(chunk_begin(r)));
    } else if (kind_ == Kind::kReduceScatter) {
      fold_direct(r * domain_, domain_, out_at(0));
    }
    ch_.signal(PiecePhase::kReduced, seq_);
    stage_ = Stage::kDirectDone;
    k_ = 0;
    return Step::kNext;
  }

  // Every rank has finished reading; all_reduce copies the peers' reduced chunks.
  Step finish_direct_reads(bool& progressed) {
    const int n = ch_.size(), r = ch_.rank();
    for (; k_ < n; ++k_) {
      if (k_ == r) continue;
      if (!ch_.wait(k_, PiecePhase::kReduced, seq_, "finished reading")) return Step::kBlocked;
      if (kind_ == Kind::kAllReduce) {
        // Rank k's chunk is reduced, and rank k no longer reads mine.
        copy_from(k_, chunk_begin(k_) * es_, in_at(chunk_begin(k_)), chunk_len(k_) * es_);
        progressed = true;
      }
    }
    if (kind_ == Kind::kAllReduce) {
      // Peers copy my reduced chunk out of my tensor: return only once they are done.
      ch_.signal(PiecePhase::kCopied, done_seq_);
      stage_ = Stage::kDirectFinal;
      k_ = 0;
      return Step::kNext;
    }
    begin_ = domain_;
    stage_ = Stage::kBegin;
    return Step::kNext;
  }

  // Direct all_reduce: every peer has copied my reduced chunk out of my tensor.
  Step await_copies() {
    const int n = ch_.size(), r = ch_.rank();
    for (; k_ < n; ++k_) {
      if (k_ == r) continue;
      if (!ch_.wait(k_, PiecePhase::kCopied, done_seq_, "copied the reduced chunks")) {
        return Step::kBlocked;
      }
    }
    begin_ = domain_;
    stage_ = Stage::kBegin;
    return Step::kNext;
  }

  // dst[0, count) = elements [first, first + count) of every rank's tensor folded in rank
  // order. The last step may write this rank's own input (all_reduce's chunk): by then every
  // other contribution to the block has been read, and an elementwise op may write the very
  // elements it reads; earlier steps accumulate in scratch (world > 2).
  void fold_direct(int64_t first, int64_t count, char* dst) {
    const int n = ch_.size();
    const int64_t per_block = std::max<int64_t>(1, kDirectFoldBytes / es_);
    // The fold so far; rank 0's block as read (in use until rank 1's arrives); another's.
    std::vector<char>& acc = ch_.scratch(0);
    std::vector<char>& first_read = ch_.scratch(1);
    std::vector<char>& next_read = ch_.scratch(2);
    for (int64_t done = 0; done < count; done += per_block) {
      const int64_t k = std::min(per_block, count - done);
      const int64_t at = (first + done) * es_, bytes = k * es_;
      const char* first_rank = bytes_of(0, at, bytes, first_read);
      if (n > 2 && acc.size() < static_cast<size_t>(bytes)) acc.resize(static_cast<size_t>(bytes));
      for (int p = 1; p < n; ++p) {
        char* out = p == n - 1 ? dst + done * es_ : acc.data();
        const char* so_far = p == 1 ? first_rank : acc.data();
        fold_(out, so_far, bytes_of(p, at, bytes, next_read), static_cast<size_t>(k));
      }
      if (finish_) finish_(dst + done * es_, static_cast<size_t>(k));
    }
  }

  // Bytes [offset, offset + bytes) of what rank k != me announced (all_gather: its block;
  // reductions: its whole tensor), copied into `dst`.
  void copy_from(int k, int64_t offset, char* dst, int64_t bytes) {
    if (bytes == 0) return;
    const PieceAnnouncement theirs = ch_.announcement(k, seq_);
    if (theirs.symmetric.id != 0) {
      std::memcpy(dst, mapped(k, theirs) + offset, static_cast<size_t>(bytes));
      return;
    }
    ch_.read_peer(k, theirs.address + static_cast<uint64_t>(offset), dst,
                  static_cast<size_t>(bytes));
  }

  // The same bytes of any rank's tensor (mine included) as a pointer: in place when they are
  // mine or mapped, else read into `scratch`.
  const char* bytes_of(int k, int64_t offset, int64_t bytes, std::vector<char>& scratch) {
    if (k == ch_.rank()) return in_ + offset;
    const PieceAnnouncement theirs = ch_.announcement(k, seq_);
    if (theirs.symmetric.id != 0) return mapped(k, theirs) + offset;
    if (scratch.size() < static_cast<size_t>(bytes)) scratch.resize(static_cast<size_t>(bytes));
    copy_from(k, offset, scratch.data(), bytes);
    return scratch.data();
  }

  const char* mapped(int k, const PieceAnnouncement& theirs) {
    return ch_.symmetric_mappings().map(theirs.symmetric.id, theirs.symmetric.offset, shared_bytes_,
                                        ch_.rank(), k);
  }

  // Rank k took the same path as this rank, or both raise. Ranks disagree only when symmetric
  // memory is on some ranks and plain tensors cannot be read directly.
  void check_same_path(int k) const {
    const bool theirs = ch_.announcement(k, seq_).direct;
    if (theirs == direct_) return;
    TDIST_THROW(DistBackendError, ch_.describe() + ": rank " +
                                      std::to_string(direct_ ? ch_.rank() : k) +
                                      " passed a tensor in symmetric memory and rank " +
                                      std::to_string(direct_ ? k : ch_.rank()) +
                                      " did not: pass contiguous symmetric-memory tensors "
                                      "(tdist::symmetric_memory::empty) on every rank, or on none");
  }

  // Every rank's block to the placer once the op is complete: rank-major from out_ (staged),
  // or my own input for every rank when the blocks are empty.
  void place_every_block() {
    for (int c = 0; c < ch_.size(); ++c) place_(c, domain_ == 0 ? in_at(0) : out_at(c * domain_));
  }

  // all_reduce: chunk j of the current piece is [chunk_begin(j), chunk_begin(j + 1)).
  int64_t chunk_begin(int j) const { return len_ * j / ch_.size(); }
  int64_t chunk_len(int j) const { return chunk_begin(j + 1) - chunk_begin(j); }
  char* in_at(int64_t element) const { return in_ + element * es_; }
  char* out_at(int64_t element) const { return out_ + element * es_; }
  void copy(char* dst, const char* src, int64_t elements) const {
    if (elements > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(elements * es_));
  }

  SameHostChannel& ch_;
  Kind kind_;
  char* in_;
  char* out_;  // (a staged placed all-gather of several pieces: gathered_)
  size_t in_bytes_, out_bytes_;
  std::unique_ptr<char[]> gathered_;
  FoldFn fold_;
  FinishFn finish_;
  BlockPlacer place_;  // all_gather_placed: where each rank's block goes (else out_)
  int root_;           // broadcast
  int64_t es_;
  std::vector<size_t> staged_;  // the bytes each rank stages for the current piece
  int64_t domain_ = 0;
  int64_t piece_elems_ = 1;
  int64_t begin_ = 0;  // the current piece: [begin_, begin_ + len_) of the domain
  int64_t len_ = 0;
  int64_t pieces_ = 0;
  uint64_t seq_ = 0;
  uint64_t done_seq_ = 0;  // direct all_reduce: its last phase's number
  Stage stage_ = Stage::kBegin;
  int k_ = 0;         // the next rank (in rank order) of the current stage
  SymmetricRef sym_;  // my symmetric tensor (id 0: none)
  bool direct_ = false;
  bool announce_output_ = false;    // symmetric all_gather: peers read my output block
  bool place_from_halves_ = false;  // a staged placed all-gather of one piece
  size_t shared_bytes_ = 0;
  bool fell_back_ = false;
};

std::unique_ptr<SameHostOp> make(SameHostChannel& channel, OpArgs args) {
  return std::make_unique<Op>(channel, std::move(args));
}

OpArgs args_for(Kind kind, ElementSpan in, ElementSpan out) {
  OpArgs args;
  args.kind = kind;
  args.in = in;
  args.out = out;
  return args;
}

}  // namespace

std::unique_ptr<SameHostOp> SameHostOp::all_reduce(SameHostChannel& channel, ElementSpan buffer,
                                                   FoldFn fold, FinishFn finish) {
  OpArgs args = args_for(Kind::kAllReduce, buffer, buffer);
  args.fold = std::move(fold);
  args.finish = std::move(finish);
  return make(channel, std::move(args));
}

std::unique_ptr<SameHostOp> SameHostOp::reduce_scatter(SameHostChannel& channel, ElementSpan in,
                                                       ElementSpan out, FoldFn fold,
                                                       FinishFn finish) {
  OpArgs args = args_for(Kind::kReduceScatter, in, out);
  args.fold = std::move(fold);
  args.finish = std::move(finish);
  return make(channel, std::move(args));
}

std::unique_ptr<SameHostOp> SameHostOp::all_gather(SameHostChannel& channel, ElementSpan in,
                                                   ElementSpan out) {
  return make(channel, args_for(Kind::kAllGather, in, out));
}

std::unique_ptr<SameHostOp> SameHostOp::all_gather_placed(SameHostChannel& channel, ElementSpan in,
                                                          BlockPlacer place) {
  OpArgs args = args_for(Kind::kAllGather, in, {});
  args.place = std::move(place);
  return make(channel, std::move(args));
}

std::unique_ptr<SameHostOp> SameHostOp::broadcast(SameHostChannel& channel, ElementSpan buffer,
                                                  int root) {
  OpArgs args = args_for(Kind::kBroadcast, buffer, buffer);
  args.root = root;
  return make(channel, std::move(args));
}

std::unique_ptr<SameHostOp> SameHostOp::all_to_all(SameHostChannel& channel, ElementSpan in,
                                                   ElementSpan out) {
  return make(channel, args_for(Kind::kAllToAll, in, out));
}

}  // namespace tdist::detail
