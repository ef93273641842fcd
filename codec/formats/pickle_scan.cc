#include "codec/formats/pickle_scan.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <initializer_list>
#include <memory>
#include <optional>
#include <unordered_map>

namespace ckptfs::formats {
namespace {

constexpr size_t kMaxStack = 1u << 20;
constexpr size_t kMaxMemo = 1u << 20;
constexpr size_t kMaxItems = 8u << 20;   // all tuple and list items ever built
constexpr size_t kMaxKeptString = 4096;  // longer strings are kept as opaque
// Deeper tuples become opaque: torch's IDs are shallow, and an unbounded
// chain of nested shared_ptrs would overflow the stack when destroyed.
constexpr uint32_t kMaxTupleDepth = 32;
// Rebuild callables between a tensor's dict key and its storage: torch
// nests at most three (_rebuild_from_type_v2, _rebuild_parameter, the
// tensor rebuild). A few more are tolerated; the bound keeps the search O(1).
constexpr size_t kMaxKeySearch = 8;

// The pickle machine's opcodes, protocols 0 to 5, under the names the
// protocol (CPython's pickletools) gives them.
enum class Op : uint8_t {
  // protocol 0 and 1
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kFloat = 'F',
  kInt = 'I',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kLong = 'L',
  kBinInt2 = 'M',
  kNone = 'N',
  kPersId = 'P',
  kBinPersId = 'Q',
  kReduce = 'R',
  kString = 'S',
  kBinString = 'T',
  kShortBinString = 'U',
  kUnicode = 'V',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kDict = 'd',
  kEmptyDict = '}',
  kAppends = 'e',
  kGet = 'g',
  kBinGet = 'h',
  kInst = 'i',
  kLongBinGet = 'j',
  kList = 'l',
  kEmptyList = ']',
  kObj = 'o',
  kPut = 'p',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  // protocol 2
  kProto = 0x80,
  kNewObj = 0x81,
  kExt1 = 0x82,
  kExt2 = 0x83,
  kExt4 = 0x84,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  // protocol 3
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  // protocol 4
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kEmptySet = 0x8f,
  kAddItems = 0x90,
  kFrozenSet = 0x91,
  kNewObjEx = 0x92,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
  // protocol 5
  kByteArray8 = 0x96,
  kNextBuffer = 0x97,
  kReadOnlyBuffer = 0x98,
};

struct Value {
  // kTensor: a tensor rebuilt on a storage (i: its index); kDict: a dict
  // being filled (i: 1 for a collections.OrderedDict, 0 for a plain dict;
  // id: its entry in Machine::dicts_, shared by every copy of the value).
  enum Kind : uint8_t { kOther, kNone, kInt, kStr, kGlobal, kTuple, kList, kPid, kTensor, kDict, kFloat };
  Kind kind = kOther;
  double f = 0;  // kFloat
  int64_t i = 0;  // kInt; kPid, kTensor: index into storages; kDict; kStr: serial of its literal
  uint32_t depth = 0;                         // kTuple: nesting depth
  uint32_t id = 0;                            // kDict: index into Machine::dicts_
  std::shared_ptr<const std::string> s;       // kStr, kGlobal ("module.name")
  std::shared_ptr<std::vector<Value>> items;  // kTuple (immutable), kList (scalars only, so no cycles)
};

// What the scanner learns about one dict while the pickle fills it. How
// dicts nest is resolved once the pickle ends (Machine::ResolveDicts): a
// dict's items are set before the dict itself is stored anywhere.
struct DictInfo {
  // Module.state_dict(): an OrderedDict that BUILD gave a __dict__ holding
  // `_metadata` (an OrderedDict of per-module versions).
  bool state_dict = false;
  bool metadata_key = false;      // has "_metadata": an OrderedDict (it is a BUILD state)
  bool param_groups_key = false;  // has "param_groups"
  bool optimizer_state = false;   // the "state" of an optimizer's state_dict
  bool optimizer_entry = false;   // one parameter's entry in such a "state"
  int32_t state = -1;             // the dict under the key "state", if any
};
// A dict stored as a value of another under an int or string key (name:
// the string key, else null).
struct DictChild {
  uint32_t parent = 0;
  uint32_t child = 0;
  std::shared_ptr<const std::string> name;
};
// Dicts the scanner keeps track of, and the items it records: past these,
// dicts are opaque and items go unrecorded, which only proves less.
constexpr size_t kMaxDicts = 1u << 20;
constexpr size_t kMaxDictItems = 1u << 20;

Status Truncated() { return Status::Error(ENODATA, "pickle: truncated"); }
Status Bad(const std::string& m) { return Status::Corruption("pickle: " + m); }
Status UnknownOpcode(uint8_t op) { return Bad("unknown opcode " + std::to_string(op)); }

DType DTypeFromTorchName(const std::string& g) {
  static const std::pair<const char*, DType> kMap[] = {
      {"torch.float64", DType::kF64},
      {"torch.float32", DType::kF32},
      {"torch.float16", DType::kF16},
      {"torch.bfloat16", DType::kBF16},
      {"torch.float8_e4m3fn", DType::kF8E4M3},
      {"torch.float8_e5m2", DType::kF8E5M2},
      {"torch.int64", DType::kI64},
      {"torch.int32", DType::kI32},
      {"torch.int16", DType::kI16},
      {"torch.int8", DType::kI8},
      {"torch.uint8", DType::kU8},
      {"torch.bool", DType::kBool},
      {"torch.uint16", DType::kU16},
      {"torch.uint32", DType::kU32},
      {"torch.uint64", DType::kU64},
      {"torch.complex64", DType::kC64},
      {"torch.complex128", DType::kC128},
  };
  for (const auto& [name, t] : kMap) {
    if (g == name) return t;
  }
  return DType::kUnknown;
}

class Machine {
 public:
  explicit Machine(std::span<const uint8_t> b) : b_(b) {}
  Result<PickleScan> Run();

 private:
  // --- input
  Result<uint64_t> Fixed(size_t n) {  // little-endian unsigned
    if (b_.size() - p_ < n) return Truncated();
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(b_[p_ + k]) << (8 * k);
    p_ += n;
    return v;
  }
  Result<std::string_view> Bytes(uint64_t n) {
    if (b_.size() - p_ < n) return Truncated();
    std::string_view v(reinterpret_cast<const char*>(b_.data() + p_), n);
    p_ += n;
    return v;
  }
  Result<std::string_view> Line() {
    for (size_t k = p_; k < b_.size(); ++k) {
      if (b_[k] == '\n') {
        std::string_view v(reinterpret_cast<const char*>(b_.data() + p_), k - p_);
        p_ = k + 1;
        return v;
      }
    }
    return Truncated();
  }
  // --- stack
  Status Push(Value v) {
    if (stack_.size() >= kMaxStack) return Bad("stack too deep");
    stack_.push_back(std::move(v));
    return Status::Ok();
  }
  Result<Value> Pop() {
    if (stack_.size() <= Floor()) return Bad("stack underflow");
    Value v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  size_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // Pops everything above the last mark, and the mark.
  Result<std::vector<Value>> PopToMark() {
    if (marks_.empty()) return Bad("no mark");
    size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Value> v(std::make_move_iterator(stack_.begin() + m), std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return v;
  }
  Status Charge(size_t n) {
    items_ += n;
    return items_ > kMaxItems ? Bad("too many items") : Status::Ok();
  }
  Status PushStr(std::string_view s, Value::Kind kind = Value::kStr) {
    Value v;
    if (s.size() <= kMaxKeptString) {
      v.kind = kind;
      v.s = std::make_shared<const std::string>(s);
      v.i = static_cast<int64_t>(strings_++);
    }
    return Push(std::move(v));
  }
  Status PushInt(int64_t i) {
    Value v;
    v.kind = Value::kInt;
    v.i = i;
    return Push(std::move(v));
  }
  Status PushFloat(double f) {
    Value v;
    v.kind = Value::kFloat;
    v.f = f;
    return Push(std::move(v));
  }
  Status PushTuple(std::vector<Value> items) {
    RETURN_IF_ERROR(Charge(items.size()));
    Value v;
    uint32_t depth = 1;
    for (const Value& it : items) depth = std::max(depth, it.depth + 1);
    if (depth > kMaxTupleDepth) return PushOther();
    v.depth = depth;
    v.kind = Value::kTuple;
    v.items = std::make_shared<std::vector<Value>>(std::move(items));
    return Push(std::move(v));
  }
  Status PushOther() { return Push(Value{}); }
  Value NewDict(bool ordered) {
    Value v;
    if (dicts_.size() >= kMaxDicts) return v;
    v.kind = Value::kDict;
    v.i = ordered ? 1 : 0;
    v.id = static_cast<uint32_t>(dicts_.size());
    dicts_.emplace_back();
    return v;
  }
  Status PushDict(bool ordered) { return Push(NewDict(ordered)); }
  // A length-prefixed string; only unicode ones matter (keys, 'storage').
  Status SizedString(size_t len_bytes, bool keep) {
    ASSIGN_OR_RETURN(uint64_t n, Fixed(len_bytes));
    ASSIGN_OR_RETURN(std::string_view s, Bytes(n));
    return keep ? PushStr(s) : PushOther();
  }
  Status TupleN(size_t n) {
    if (stack_.size() - Floor() < n) return Bad("stack underflow");
    std::vector<Value> items(std::make_move_iterator(stack_.end() - n), std::make_move_iterator(stack_.end()));
    stack_.resize(stack_.size() - n);
    return PushTuple(std::move(items));
  }
  // --- memo
  Status Put(uint64_t idx) {
    if (stack_.size() <= Floor()) return Bad("memo put on empty stack");
    if (memo_.size() >= kMaxMemo && !memo_.count(idx)) return Bad("memo too large");
    memo_[idx] = stack_.back();
    return Status::Ok();
  }
  Status Get(uint64_t idx) {
    auto it = memo_.find(idx);
    if (it == memo_.end()) return Bad("memo get of missing key");
    return Push(it->second);
  }
  // --- semantic hooks
  Status Append(Value list, std::vector<Value> items);
  void SetItems(const Value& dict, const std::vector<Value>& items);
  void RecordDictItem(uint32_t dict, const Value& key, const Value& value);
  void Build(const Value& object, const Value& state);
  void ResolveDicts();
  void DcpStorageField(const std::string& key, const Value& value);
  void RecordGroupNumber(const std::string& key, const Value& value);
  Status PersistentId(Value pid);
  std::string PendingKey() const;
  Status Reduce();
  Status TextInt(bool* handled_as_index, uint64_t* idx);
  // --- opcodes: Step dispatches each to the handler of its family
  using Handler = Status (Machine::*)(Op op);
  static const std::array<Handler, 256>& Handlers();
  Status Step(uint8_t op);
  Status Framing(Op op);
  Status StackOp(Op op);
  Status PushConstant(Op op);
  Status PushString(Op op);
  Status BuildContainer(Op op);
  Status FillContainer(Op op);
  Status MemoOp(Op op);
  Status BuildObject(Op op);
  Status ExternalRef(Op op);

  std::span<const uint8_t> b_;
  size_t p_ = 0;
  bool stopped_ = false;  // STOP was read
  std::vector<Value> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Value> memo_;
  size_t items_ = 0;
  PickleScan out_;
  std::unordered_map<std::string, size_t> by_key_;
  std::vector<DictInfo> dicts_;  // every dict the pickle built, by Value::id
  std::vector<std::pair<uint32_t, uint32_t>> dict_tensors_;  // (dict, storage) of a tensor value
  std::vector<DictChild> dict_children_;
  uint64_t strings_ = 0;  // string literals read so far
  // DCP metadata: set by its Metadata global; the fields of the
  // MetadataIndex and _StorageInfo being built.
  bool dcp_metadata_ = false;
  DcpItem dcp_pending_;
  bool dcp_has_path_ = false, dcp_has_offset_ = false;
};

// Lists keep only scalars: that is all the scanner needs (legacy key lists)
// and it rules out reference cycles through shared_ptr.
Status Machine::Append(Value list, std::vector<Value> items) {
  if (list.kind != Value::kList) return Status::Ok();
  RETURN_IF_ERROR(Charge(items.size()));
  for (auto& v : items) {
    if (v.kind == Value::kTuple || v.kind == Value::kList) v = Value{};
    list.items->push_back(std::move(v));
  }
  return Status::Ok();
}

// Key/value pairs stored into `dict` (or into an object SETITEMS fills):
// what a dict holds is recorded for ResolveDicts, which tells a module's
// state_dict and an optimizer's state from other dicts.
void Machine::SetItems(const Value& dict, const std::vector<Value>& items) {
  for (size_t k = 0; k + 1 < items.size(); k += 2) {
    const Value& key = items[k];
    const Value& value = items[k + 1];
    if (key.kind == Value::kStr && dcp_metadata_) DcpStorageField(*key.s, value);
    if (key.kind == Value::kStr) {
      if (*key.s == "lr" || *key.s == "eps") RecordGroupNumber(*key.s, value);
      if (*key.s == "param_names" && value.kind == Value::kList) {
        for (const Value& n : *value.items) out_.param_names.push_back(n.kind == Value::kStr ? *n.s : std::string());
      }
    }
    if (dict.kind == Value::kDict) RecordDictItem(dict.id, key, value);
  }
}

void Machine::RecordDictItem(uint32_t dict, const Value& key, const Value& value) {
  const bool str_key = key.kind == Value::kStr;
  if (value.kind == Value::kTensor && dict_tensors_.size() < kMaxDictItems) {
    dict_tensors_.emplace_back(dict, static_cast<uint32_t>(value.i));
  } else if (value.kind == Value::kDict && (str_key || key.kind == Value::kInt) &&
             dict_children_.size() < kMaxDictItems) {
    dict_children_.push_back({dict, value.id, str_key ? key.s : nullptr});
  }
  if (!str_key) return;
  DictInfo& d = dicts_[dict];
  if (*key.s == "state" && value.kind == Value::kDict) d.state = static_cast<int32_t>(value.id);
  d.param_groups_key |= *key.s == "param_groups";
  d.metadata_key |= *key.s == "_metadata" && value.kind == Value::kDict && value.i == 1;
}

// BUILD sets an object's state. Module.state_dict() returns an OrderedDict
// with a `_metadata` attribute, which pickles as the OrderedDict, its items,
// then BUILD with {'_metadata': OrderedDict(...)}.
void Machine::Build(const Value& object, const Value& state) {
  if (object.kind == Value::kDict && object.i == 1 && state.kind == Value::kDict &&
      dicts_[state.id].metadata_key) {
    dicts_[object.id].state_dict = true;
  }
}

// Once every dict is filled: the tensors of a module's state_dict are module
// entries; a dict with "param_groups" and a "state" dict is an optimizer's
// state_dict, the dicts in its "state" its per-parameter entries.
void Machine::ResolveDicts() {
  for (const DictInfo& d : dicts_) {
    if (d.state < 0 || !d.param_groups_key) continue;
    out_.optimizer_state = true;
    dicts_[static_cast<size_t>(d.state)].optimizer_state = true;
  }
  for (const DictChild& c : dict_children_) {
    if (!dicts_[c.parent].optimizer_state) continue;
    dicts_[c.child].optimizer_entry = true;
    if (c.name) out_.state_names.push_back(*c.name);
  }
  for (const auto& [dict, storage] : dict_tensors_) {
    StorageRef& s = out_.storages[storage];
    s.module_entry |= dicts_[dict].state_dict;
    s.optimizer_entry |= dicts_[dict].optimizer_entry;
  }
}

// A param_groups entry's learning rate or epsilon, when it is a plain
// number (a tensor lr, as capturable optimizers allow, is not read).
void Machine::RecordGroupNumber(const std::string& key, const Value& value) {
  double x = 0;
  if (value.kind == Value::kFloat) {
    x = value.f;
  } else if (value.kind == Value::kInt) {
    x = static_cast<double>(value.i);
  } else {
    return;
  }
  (key == "lr" ? out_.group_lrs : out_.group_eps).push_back(x);
}

// storage_data maps MetadataIndex(fqn, ...) to _StorageInfo(relative_path,
// offset, length); both are dataclasses pickled as NEWOBJ + BUILD of their
// __dict__, key before value, so their fields arrive in that order.
void Machine::DcpStorageField(const std::string& key, const Value& value) {
  if (key == "fqn" && value.kind == Value::kStr) {
    dcp_pending_.fqn = *value.s;
    dcp_pending_.fqn_order = static_cast<uint64_t>(value.i);
    dcp_has_path_ = dcp_has_offset_ = false;
  } else if (key == "relative_path" && value.kind == Value::kStr) {
    dcp_pending_.relative_path = *value.s;
    dcp_has_path_ = true;
    dcp_has_offset_ = false;
  } else if (key == "offset" && dcp_has_path_ && value.kind == Value::kInt && value.i >= 0) {
    dcp_pending_.offset = static_cast<uint64_t>(value.i);
    dcp_has_offset_ = true;
  } else if (key == "length" && dcp_has_offset_ && value.kind == Value::kInt && value.i >= 0 &&
             !dcp_pending_.fqn.empty() && out_.dcp_items.size() < kMaxItems) {
    dcp_pending_.length = static_cast<uint64_t>(value.i);
    out_.dcp_items.push_back(dcp_pending_);
    dcp_has_path_ = dcp_has_offset_ = false;
  }
}

// The storage a rebuild's arguments name, directly or one tuple down
// (_rebuild_parameter(tensor, ...), _rebuild_from_type_v2(fn, type, args, state)).
std::optional<int64_t> StorageArg(const Value& args) {
  if (args.kind != Value::kTuple) return std::nullopt;
  for (const Value& a : *args.items) {
    if (a.kind == Value::kPid || a.kind == Value::kTensor) return a.i;
  }
  for (const Value& a : *args.items) {
    if (a.kind != Value::kTuple) continue;
    for (const Value& b : *a.items) {
      if (b.kind == Value::kPid || b.kind == Value::kTensor) return b.i;
    }
  }
  return std::nullopt;
}

Status Machine::PersistentId(Value pid) {
  Value ref;  // what BINPERSID pushes: the storage, or opaque
  const auto* t = pid.kind == Value::kTuple ? pid.items.get() : nullptr;
  if (t && t->size() >= 5 && (*t)[0].kind == Value::kStr && *(*t)[0].s == "storage" && (*t)[1].kind == Value::kGlobal &&
      (*t)[2].kind == Value::kStr) {
    const std::string& key = *(*t)[2].s;
    auto [it, fresh] = by_key_.try_emplace(key, out_.storages.size());
    if (fresh) {
      if (out_.storages.size() >= (1u << 20)) return Bad("too many storages");
      StorageRef s;
      s.key = key;
      s.type = *(*t)[1].s;
      if ((*t)[3].kind == Value::kStr) s.location = *(*t)[3].s;
      if ((*t)[4].kind == Value::kInt && (*t)[4].i >= 0) s.numel = static_cast<uint64_t>((*t)[4].i);
      StorageType st = StorageTypeInfo(s.type);
      s.dtype = st.dtype;
      s.elsize = st.elsize;
      s.label = PendingKey();
      s.index = static_cast<uint32_t>(out_.storages.size());
      out_.storages.push_back(std::move(s));
    }
    ref.kind = Value::kPid;
    ref.i = static_cast<int64_t>(it->second);
  }
  return Push(std::move(ref));
}

// The key of the dict item whose value holds the storage being loaded.
// torch pickles `key: tensor` as
//   key, GLOBAL _rebuild_tensor_v2, MARK, <pid tuple> BINPERSID, ...
// possibly with more GLOBALs (and MARKs) between key and pid when the
// tensor is a Parameter or a subclass. Values above the innermost mark are
// the pid's sibling arguments, never the key. Below it, rebuild callables
// are skipped and the next value is the key if it is a string. A tensor in
// a list or under an int key gets no label, rather than some unrelated
// string further down (a list's key, a sibling's value).
std::string Machine::PendingKey() const {
  size_t i = marks_.empty() ? stack_.size() : marks_.back();
  for (size_t n = 0; i > 0 && n < kMaxKeySearch && stack_[i - 1].kind == Value::kGlobal; ++n) --i;
  if (i == 0 || stack_[i - 1].kind != Value::kStr) return {};
  return *stack_[i - 1].s;
}

// Integers of a tuple, or nullopt when it is not a tuple of non-negative ints.
std::optional<std::vector<uint64_t>> IntTuple(const Value& v) {
  if (v.kind != Value::kTuple) return std::nullopt;
  std::vector<uint64_t> out;
  for (const Value& it : *v.items) {
    if (it.kind != Value::kInt || it.i < 0) return std::nullopt;
    out.push_back(static_cast<uint64_t>(it.i));
  }
  return out;
}

// The size tuple when (offset, size, stride) views numel elements exactly,
// contiguously and in C order.
std::vector<uint64_t> WholeStorageShape(const Value& offset, const Value& size, const Value& stride, uint64_t numel) {
  auto dims = IntTuple(size), steps = IntTuple(stride);
  if (offset.kind != Value::kInt || offset.i != 0 || !dims || !steps || dims->size() != steps->size()) return {};
  uint64_t expect = 1;
  for (size_t k = dims->size(); k-- > 0;) {
    if ((*dims)[k] != 1 && (*steps)[k] != expect) return {};
    if ((*dims)[k] != 0 && expect > UINT64_MAX / (*dims)[k]) return {};
    expect *= (*dims)[k];
  }
  return expect == numel ? *dims : std::vector<uint64_t>{};
}

// _rebuild_tensor_v2(storage, offset, size, stride, ...) and
// _rebuild_tensor_v3(..., dtype, ...) give the tensor's shape; v3 also
// carries the dtype that an UntypedStorage lacks.
Status Machine::Reduce() {
  ASSIGN_OR_RETURN(Value args, Pop());
  ASSIGN_OR_RETURN(Value fn, Pop());
  const bool v2 = fn.kind == Value::kGlobal && *fn.s == "torch._utils._rebuild_tensor_v2";
  const bool v3 = fn.kind == Value::kGlobal && *fn.s == "torch._utils._rebuild_tensor_v3";
  if ((v2 || v3) && args.kind == Value::kTuple && args.items->size() >= 4) {
    const auto& a = *args.items;
    if (a[0].kind == Value::kPid) {
      StorageRef& s = out_.storages[static_cast<size_t>(a[0].i)];
      if (v3 && a.size() >= 7 && a[6].kind == Value::kGlobal && s.dtype == DType::kUnknown) {
        s.dtype = DTypeFromTorchName(*a[6].s);
      }
      if (!s.viewed) {
        s.viewed = true;
        const uint64_t elsize = s.dtype == DType::kUnknown ? 0 : DTypeSize(s.dtype);
        // Untyped storages count bytes; their tensors count elements.
        const uint64_t numel = s.elsize == 1 && elsize > 1 ? s.numel / elsize : s.numel;
        s.shape = WholeStorageShape(a[1], a[2], a[3], numel);
      }
    }
  }
  if (fn.kind != Value::kGlobal) return PushOther();
  if (*fn.s == "collections.OrderedDict") return PushDict(/*ordered=*/true);
  // What torch's own rebuild functions return is a tensor on the storage
  // their arguments name.
  if (fn.s->starts_with("torch.")) {
    if (std::optional<int64_t> at = StorageArg(args)) {
      Value t;
      t.kind = Value::kTensor;
      t.i = *at;
      return Push(std::move(t));
    }
  }
  return PushOther();
}

Status Machine::TextInt(bool* ok, uint64_t* idx) {
  ASSIGN_OR_RETURN(std::string_view line, Line());
  auto r = std::from_chars(line.data(), line.data() + line.size(), *idx);
  *ok = r.ec == std::errc() && r.ptr == line.data() + line.size();
  return Status::Ok();
}

const std::array<Machine::Handler, 256>& Machine::Handlers() {
  static const std::array<Handler, 256> table = [] {
    std::array<Handler, 256> t{};
    auto add = [&t](Handler h, std::initializer_list<Op> ops) {
      for (Op op : ops) t[static_cast<uint8_t>(op)] = h;
    };
    add(&Machine::Framing, {Op::kProto, Op::kFrame, Op::kStop});
    add(&Machine::StackOp, {Op::kMark, Op::kPop, Op::kPopMark, Op::kDup});
    add(&Machine::PushConstant, {Op::kInt, Op::kLong, Op::kBinInt, Op::kBinInt1, Op::kBinInt2, Op::kLong1, Op::kLong4,
                                 Op::kFloat, Op::kBinFloat, Op::kNone, Op::kNewTrue, Op::kNewFalse});
    add(&Machine::PushString,
        {Op::kString, Op::kBinString, Op::kShortBinString, Op::kUnicode, Op::kBinUnicode, Op::kShortBinUnicode,
         Op::kBinUnicode8, Op::kBinBytes, Op::kShortBinBytes, Op::kBinBytes8, Op::kByteArray8});
    add(&Machine::BuildContainer, {Op::kEmptyTuple, Op::kTuple, Op::kTuple1, Op::kTuple2, Op::kTuple3, Op::kEmptyList,
                                   Op::kList, Op::kEmptyDict, Op::kDict, Op::kEmptySet, Op::kFrozenSet});
    add(&Machine::FillContainer, {Op::kAppend, Op::kAppends, Op::kSetItem, Op::kSetItems, Op::kAddItems});
    add(&Machine::MemoOp,
        {Op::kPut, Op::kBinPut, Op::kLongBinPut, Op::kMemoize, Op::kGet, Op::kBinGet, Op::kLongBinGet});
    add(&Machine::BuildObject,
        {Op::kGlobal, Op::kStackGlobal, Op::kReduce, Op::kBuild, Op::kNewObj, Op::kNewObjEx, Op::kInst, Op::kObj});
    add(&Machine::ExternalRef,
        {Op::kPersId, Op::kBinPersId, Op::kExt1, Op::kExt2, Op::kExt4, Op::kNextBuffer, Op::kReadOnlyBuffer});
    return t;
  }();
  return table;
}

Status Machine::Step(uint8_t op) {
  const Handler h = Handlers()[op];
  if (h == nullptr) return UnknownOpcode(op);
  return (this->*h)(static_cast<Op>(op));
}

// Each family handler is called with its own opcodes only (Handlers());
// its default case is unreachable.
Status Machine::Framing(Op op) {
  switch (op) {
    case Op::kProto:
      return Fixed(1).status();
    case Op::kFrame:
      return Fixed(8).status();  // framing is transparent
    case Op::kStop:
      stopped_ = true;
      return Status::Ok();
    default:
      return UnknownOpcode(static_cast<uint8_t>(op));
  }
}

Status Machine::StackOp(Op op) {
  switch (op) {
    case Op::kMark:
      if (marks_.size() >= kMaxStack) return Bad("too many marks");
      marks_.push_back(stack_.size());
      return Status::Ok();
    case Op::kPop:
      return Pop().status();
    case Op::kPopMark:
      return PopToMark().status();
    case Op::kDup:
      if (stack_.size() <= Floor()) return Bad("dup on empty stack");
      return Push(stack_.back());
    default:
      return UnknownOpcode(static_cast<uint8_t>(op));
  }
}

Status Machine::PushConstant(Op op) {
  switch (op) {
    case Op::kBinInt: {
      ASSIGN_OR_RETURN(uint64_t v, Fixed(4));
      return PushInt(static_cast<int32_t>(v));
    }
    case Op::kBinInt1: {
      ASSIGN_OR_RETURN(uint64_t v, Fixed(1));
      return PushInt(static_cast<int64_t>(v));
    }
    case Op::kBinInt2: {
      ASSIGN_OR_RETURN(uint64_t v, Fixed(2));
      return PushInt(static_cast<int64_t>(v));
    }
    case Op::kLong1:
    case Op::kLong4: {
      ASSIGN_OR_RETURN(uint64_t n, Fixed(op == Op::kLong1 ? 1 : 4));
      ASSIGN_OR_RETURN(std::string_view d, Bytes(n));
      if (n > 8) return PushOther();
      uint64_t v = 0;
      for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(static_cast<uint8_t>(d[k])) << (8 * k);
      if (n > 0 && n < 8 && (static_cast<uint8_t>(d[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign-extend
      return PushInt(static_cast<int64_t>(v));
    }
    case Op::kInt:
    case Op::kLong: {  // decimal text
      ASSIGN_OR_RETURN(std::string_view line, Line());
      if (!line.empty() && line.back() == 'L') line.remove_suffix(1);
      int64_t v;
      auto r = std::from_chars(line.data(), line.data() + line.size(), v);
      if (r.ec != std::errc() || r.ptr != line.data() + line.size()) return PushOther();
      return PushInt(v);
    }
    case Op::kFloat: {  // decimal text
      ASSIGN_OR_RETURN(std::string_view line, Line());
      double f = 0;
      auto r = std::from_chars(line.data(), line.data() + line.size(), f);
      if (r.ec != std::errc() || r.ptr != line.data() + line.size()) return PushOther();
      return PushFloat(f);
    }
    case Op::kBinFloat: {  // big-endian IEEE double
      ASSIGN_OR_RETURN(uint64_t swapped, Fixed(8));
      return PushFloat(std::bit_cast<double>(__builtin_bswap64(swapped)));
    }
    case Op::kNone: {
      Value v;
      v.kind = Value::kNone;
      return Push(std::move(v));
    }
    case Op::kNewTrue:
      return PushInt(1);
    case Op::kNewFalse:
      return PushInt(0);
    default:
      return UnknownOpcode(static_cast<uint8_t>(op));
  }
}

// Only unicode strings are kept (keys, 'storage'); bytes become opaque.
Status Machine::PushString(Op op) {
  switch (op) {
    case Op::kBinUnicode:
    case Op::kBinString:
    case Op::kBinBytes:
      return SizedString(4, op == Op::kBinUnicode);
    case Op::kShortBinUnicode:
    case Op::kShortBinString:
    case Op::kShortBinBytes:
      return SizedString(1, op == Op::kShortBinUnicode);
    case Op::kBinUnicode8:
    case Op::kBinBytes8:
    case Op::kByteArray8:
      return SizedString(8, op == Op::kBinUnicode8);
    case Op::kUnicode: {  // raw-unicode-escape; keys are ASCII
      ASSIGN_OR_RETURN(auto s, Line());
      return PushStr(s);
    }
    case Op::kString:
      RETURN_IF_ERROR(Line().status());
      return PushOther();
    default:
      return UnknownOpcode(static_cast<uint8_t>(op));
  }
}

Status Machine::BuildContainer(Op op) {
  switch (op) {
    case Op::kEmptyTuple:
      return PushTuple({});
    case Op::kTuple: {
      ASSIGN_OR_RETURN(auto v, PopToMark());
      return PushTuple(std::move(v));
    }
    case Op::kTuple1:
      return TupleN(1);
    case Op::kTuple2:
      return TupleN(2);
    case Op::kTuple3:
      return TupleN(3);
    case Op::kEmptyList:
    case Op::kList: {
      std::vector<Value> items;
      if (op == Op::kList) {
        ASSIGN_OR_RETURN(items, PopToMark());
      }
      Value v;
      v.kind = Value::kList;
      v.items = std::make_shared<std::vector<Value>>();
      RETURN_IF_ERROR(Append(v, std::move(items)));
      return Push(std::move(v));
    }
    case Op::kEmptyDict:
      return PushDict(/*ordered=*/false);
    case Op::kDict: {
      ASSIGN_OR_RETURN(auto items, PopToMark());
      Value dict = NewDict(/*ordered=*/false);
      SetItems(dict, items);
      return Push(std::move(dict));
    }
    case Op::kEmptySet:
      return PushOther();
    case Op::kFrozenSet:
      RETURN_IF_ERROR(PopToMark().status());
      return PushOther();
    default:
      return UnknownOpcode(static_cast<uint8_t>(op));
  }
}

Status Machine::FillContainer(Op op) {
  switch (op) {
    case Op::kAppend: {
      ASSIGN_OR_RETURN(Value v, Pop());
      if (stack_.size() <= Floor()) return Bad("append without list");
      std::vector<Value> one;
      one.push_back(std::move(v));
      return Append(stack_.back(), std::move(one));
    }
    case Op::kAppends: {
      ASSIGN_OR_RETURN(auto items, PopToMark());
      if (stack_.size() <= Floor()) return Bad("appends without list");
      return Append(stack_.back(), std::move(items));
    }
    case Op::kSetItem: {
      std::vector<Value> pair(2);
      ASSIGN_OR_RETURN(pair[1], Pop());
      ASSIGN_OR_RETURN(pair[0], Pop());
      if (stack_.size() <= Floor()) return Bad("setitem without dict");
      SetItems(stack_.back(), pair);
      return Status::Ok();
    }
    case Op::kSetItems: {
      ASSIGN_OR_RETURN(auto items, PopToMark());
      if (stack_.size() <= Floor()) return Bad("setitems without target");
      SetItems(stack_.back(), items);
      return Status::Ok();
    }
    case Op::kAddItems:  // sets
      RETURN_IF_ERROR(PopToMark().status());
      return stack_.size() > Floor() ? Status::Ok() : Bad("additems without target");
    default:
      return UnknownOpcode(static_cast<uint8_t>(op));
  }
}

Status Machine::MemoOp(Op op) {
  switch (op) {
    case Op::kBinPut: {
      ASSIGN_OR_RETURN(uint64_t i, Fixed(1));
      return Put(i);
    }
    case Op::kLongBinPut: {
      ASSIGN_OR_RETURN(uint64_t i, Fixed(4));
      return Put(i);
    }
    case Op::kMemoize:
      return Put(memo_.size());
    case Op::kBinGet: {
      ASSIGN_OR_RETURN(uint64_t i, Fixed(1));
      return Get(i);
    }
    case Op::kLongBinGet: {
      ASSIGN_OR_RETURN(uint64_t i, Fixed(4));
      return Get(i);
    }
    case Op::kPut:
    case Op::kGet: {  // decimal text index
      bool ok = false;
      uint64_t i = 0;
      RETURN_IF_ERROR(TextInt(&ok, &i));
      if (!ok) return Bad("bad memo index");
      return op == Op::kPut ? Put(i) : Get(i);
    }
    default:
      return UnknownOpcode(static_cast<uint8_t>(op));
  }
}

Status Machine::BuildObject(Op op) {
  switch (op) {
    case Op::kGlobal: {
      ASSIGN_OR_RETURN(std::string_view mod, Line());
      ASSIGN_OR_RETURN(std::string_view name, Line());
      dcp_metadata_ |= mod == "torch.distributed.checkpoint.metadata" && name == "Metadata";
      return PushStr(std::string(mod) + "." + std::string(name), Value::kGlobal);
    }
    case Op::kStackGlobal: {
      ASSIGN_OR_RETURN(Value name, Pop());
      ASSIGN_OR_RETURN(Value mod, Pop());
      if (name.kind != Value::kStr || mod.kind != Value::kStr) return PushOther();
      dcp_metadata_ |= *mod.s == "torch.distributed.checkpoint.metadata" && *name.s == "Metadata";
      return PushStr(*mod.s + "." + *name.s, Value::kGlobal);
    }
    case Op::kReduce:
      return Reduce();
    case Op::kBuild: {
      ASSIGN_OR_RETURN(Value state, Pop());
      if (stack_.size() <= Floor()) return Bad("build without object");
      Build(stack_.back(), state);
      return Status::Ok();
    }
    case Op::kNewObj:
      RETURN_IF_ERROR(Pop().status());
      RETURN_IF_ERROR(Pop().status());
      return PushOther();
    case Op::kNewObjEx:
      for (int k = 0; k < 3; ++k) RETURN_IF_ERROR(Pop().status());
      return PushOther();
    case Op::kInst:
      RETURN_IF_ERROR(Line().status());
      RETURN_IF_ERROR(Line().status());
      RETURN_IF_ERROR(PopToMark().status());
      return PushOther();
    case Op::kObj:
      RETURN_IF_ERROR(PopToMark().status());
      return PushOther();
    default:
      return UnknownOpcode(static_cast<uint8_t>(op));
  }
}

// What the pickle names outside itself: persistent ids (torch's storages),
// the extension registry and out-of-band buffers.
Status Machine::ExternalRef(Op op) {
  switch (op) {
    case Op::kBinPersId: {
      ASSIGN_OR_RETURN(Value pid, Pop());
      return PersistentId(std::move(pid));
    }
    case Op::kPersId:
      RETURN_IF_ERROR(Line().status());
      return PushOther();
    case Op::kExt1:
      RETURN_IF_ERROR(Fixed(1).status());
      return PushOther();
    case Op::kExt2:
      RETURN_IF_ERROR(Fixed(2).status());
      return PushOther();
    case Op::kExt4:
      RETURN_IF_ERROR(Fixed(4).status());
      return PushOther();
    case Op::kNextBuffer:
      return PushOther();
    case Op::kReadOnlyBuffer:
      return stack_.size() > Floor() ? Status::Ok() : Bad("readonly_buffer on empty stack");
    default:
      return UnknownOpcode(static_cast<uint8_t>(op));
  }
}

Result<PickleScan> Machine::Run() {
  while (!stopped_) {
    if (p_ >= b_.size()) return Truncated();
    uint8_t op = b_[p_++];
    RETURN_IF_ERROR(Step(op));
  }
  if (stack_.size() == 1 && marks_.empty() && stack_[0].kind == Value::kList) {
    for (const Value& v : *stack_[0].items) {
      if (v.kind != Value::kStr) {
        out_.str_list.clear();
        break;
      }
      out_.str_list.push_back(*v.s);
    }
  }
  out_.end = p_;
  ResolveDicts();
  return std::move(out_);
}

}  // namespace

StorageType StorageTypeInfo(const std::string& g) {
  static const std::tuple<const char*, DType, unsigned> kMap[] = {
      {"torch.DoubleStorage", DType::kF64, 8},       {"torch.FloatStorage", DType::kF32, 4},
      {"torch.HalfStorage", DType::kF16, 2},         {"torch.BFloat16Storage", DType::kBF16, 2},
      {"torch.LongStorage", DType::kI64, 8},         {"torch.IntStorage", DType::kI32, 4},
      {"torch.ShortStorage", DType::kI16, 2},        {"torch.CharStorage", DType::kI8, 1},
      {"torch.ByteStorage", DType::kU8, 1},          {"torch.BoolStorage", DType::kBool, 1},
      {"torch.ComplexFloatStorage", DType::kC64, 8}, {"torch.ComplexDoubleStorage", DType::kC128, 16},
      {"torch.QInt8Storage", DType::kI8, 1},         {"torch.QUInt8Storage", DType::kU8, 1},
      {"torch.QInt32Storage", DType::kI32, 4},       {"torch.QUInt4x2Storage", DType::kU8, 1},
      {"torch.QUInt2x4Storage", DType::kU8, 1},      {"torch.UntypedStorage", DType::kUnknown, 1},
  };
  for (const auto& [name, t, size] : kMap) {
    if (g == name) return {t, size};
  }
  return {DType::kUnknown, 0};
}

Result<PickleScan> ScanPickle(std::span<const uint8_t> bytes) { return Machine(bytes).Run(); }

}  // namespace ckptfs::formats
