from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT64: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_INT64: _ClassVar[DType]
    DTYPE_BOOL: _ClassVar[DType]
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT64: DType
DTYPE_FLOAT32: DType
DTYPE_INT64: DType
DTYPE_BOOL: DType

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data", "shared")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    shared: SharedMemoryRef
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., shared: _Optional[_Union[SharedMemoryRef, _Mapping]] = ...) -> None: ...

class SharedMemoryRef(_message.Message):
    __slots__ = ("region", "offset", "capability")
    REGION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    region: str
    offset: int
    capability: bytes
    def __init__(self, region: _Optional[str] = ..., offset: _Optional[int] = ..., capability: _Optional[bytes] = ...) -> None: ...

class SharedMemoryRegion(_message.Message):
    __slots__ = ("region", "offset", "capacity", "capability")
    REGION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    region: str
    offset: int
    capacity: int
    capability: bytes
    def __init__(self, region: _Optional[str] = ..., offset: _Optional[int] = ..., capacity: _Optional[int] = ..., capability: _Optional[bytes] = ...) -> None: ...

class IndexItem(_message.Message):
    __slots__ = ("index", "slice")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SLICE_FIELD_NUMBER: _ClassVar[int]
    index: int
    slice: Slice
    def __init__(self, index: _Optional[int] = ..., slice: _Optional[_Union[Slice, _Mapping]] = ...) -> None: ...

class Slice(_message.Message):
    __slots__ = ("start", "stop", "step")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    start: int
    stop: int
    step: int
    def __init__(self, start: _Optional[int] = ..., stop: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class IntList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class IndexList(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[IndexItem]
    def __init__(self, items: _Optional[_Iterable[_Union[IndexItem, _Mapping]]] = ...) -> None: ...

class AttrValue(_message.Message):
    __slots__ = ("i", "f", "s", "b", "ints", "tensor", "index")
    I_FIELD_NUMBER: _ClassVar[int]
    F_FIELD_NUMBER: _ClassVar[int]
    S_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    INTS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    i: int
    f: float
    s: str
    b: bool
    ints: IntList
    tensor: Tensor
    index: IndexList
    def __init__(self, i: _Optional[int] = ..., f: _Optional[float] = ..., s: _Optional[str] = ..., b: _Optional[bool] = ..., ints: _Optional[_Union[IntList, _Mapping]] = ..., tensor: _Optional[_Union[Tensor, _Mapping]] = ..., index: _Optional[_Union[IndexList, _Mapping]] = ...) -> None: ...

class GraphInput(_message.Message):
    __slots__ = ("name", "shape", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("id", "op", "inputs", "attrs")
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttrValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrValue, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    id: str
    op: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    attrs: _containers.MessageMap[str, AttrValue]
    def __init__(self, id: _Optional[str] = ..., op: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., attrs: _Optional[_Mapping[str, AttrValue]] = ...) -> None: ...

class GraphOutput(_message.Message):
    __slots__ = ("name", "node")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    name: str
    node: str
    def __init__(self, name: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class OpDef(_message.Message):
    __slots__ = ("name", "operands", "expression", "derivatives", "doc")
    class DerivativesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPERANDS_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    DERIVATIVES_FIELD_NUMBER: _ClassVar[int]
    DOC_FIELD_NUMBER: _ClassVar[int]
    name: str
    operands: _containers.RepeatedScalarFieldContainer[str]
    expression: str
    derivatives: _containers.ScalarMap[str, str]
    doc: str
    def __init__(self, name: _Optional[str] = ..., operands: _Optional[_Iterable[str]] = ..., expression: _Optional[str] = ..., derivatives: _Optional[_Mapping[str, str]] = ..., doc: _Optional[str] = ...) -> None: ...

class Graph(_message.Message):
    __slots__ = ("inputs", "nodes", "outputs", "op_defs")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    OP_DEFS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[GraphInput]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    outputs: _containers.RepeatedCompositeFieldContainer[GraphOutput]
    op_defs: _containers.RepeatedCompositeFieldContainer[OpDef]
    def __init__(self, inputs: _Optional[_Iterable[_Union[GraphInput, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[GraphOutput, _Mapping]]] = ..., op_defs: _Optional[_Iterable[_Union[OpDef, _Mapping]]] = ...) -> None: ...

class NodeType(_message.Message):
    __slots__ = ("id", "shape", "dtype")
    ID_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    id: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    def __init__(self, id: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ...) -> None: ...

class RegisterGraphRequest(_message.Message):
    __slots__ = ("graph",)
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    graph: Graph
    def __init__(self, graph: _Optional[_Union[Graph, _Mapping]] = ...) -> None: ...

class RegisterGraphResponse(_message.Message):
    __slots__ = ("graph_id", "created", "types", "custom_ops")
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_OPS_FIELD_NUMBER: _ClassVar[int]
    graph_id: str
    created: bool
    types: _containers.RepeatedCompositeFieldContainer[NodeType]
    custom_ops: _containers.RepeatedCompositeFieldContainer[OpInfo]
    def __init__(self, graph_id: _Optional[str] = ..., created: _Optional[bool] = ..., types: _Optional[_Iterable[_Union[NodeType, _Mapping]]] = ..., custom_ops: _Optional[_Iterable[_Union[OpInfo, _Mapping]]] = ...) -> None: ...

class EvaluateRequest(_message.Message):
    __slots__ = ("graph_id", "inputs", "outputs", "nodes", "backend", "output_region")
    class InputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_REGION_FIELD_NUMBER: _ClassVar[int]
    graph_id: str
    inputs: _containers.MessageMap[str, Tensor]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    backend: str
    output_region: SharedMemoryRegion
    def __init__(self, graph_id: _Optional[str] = ..., inputs: _Optional[_Mapping[str, Tensor]] = ..., outputs: _Optional[_Iterable[str]] = ..., nodes: _Optional[_Iterable[str]] = ..., backend: _Optional[str] = ..., output_region: _Optional[_Union[SharedMemoryRegion, _Mapping]] = ...) -> None: ...

class EvaluateResponse(_message.Message):
    __slots__ = ("outputs", "nodes")
    class OutputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    class NodesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.MessageMap[str, Tensor]
    nodes: _containers.MessageMap[str, Tensor]
    def __init__(self, outputs: _Optional[_Mapping[str, Tensor]] = ..., nodes: _Optional[_Mapping[str, Tensor]] = ...) -> None: ...

class GradientRequest(_message.Message):
    __slots__ = ("graph_id", "inputs", "wrt", "seeds", "outputs", "return_outputs", "semiring", "semiring_params", "return_components", "best_paths", "backend", "retain", "hooks", "output_region", "semirings", "best_path_all", "top_paths")
    class InputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    class SeedsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    class SemiringParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttrValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrValue, _Mapping]] = ...) -> None: ...
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    WRT_FIELD_NUMBER: _ClassVar[int]
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    RETURN_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    SEMIRING_FIELD_NUMBER: _ClassVar[int]
    SEMIRING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    RETURN_COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    BEST_PATHS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    RETAIN_FIELD_NUMBER: _ClassVar[int]
    HOOKS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_REGION_FIELD_NUMBER: _ClassVar[int]
    SEMIRINGS_FIELD_NUMBER: _ClassVar[int]
    BEST_PATH_ALL_FIELD_NUMBER: _ClassVar[int]
    TOP_PATHS_FIELD_NUMBER: _ClassVar[int]
    graph_id: str
    inputs: _containers.MessageMap[str, Tensor]
    wrt: _containers.RepeatedScalarFieldContainer[str]
    seeds: _containers.MessageMap[str, Tensor]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    return_outputs: bool
    semiring: str
    semiring_params: _containers.MessageMap[str, AttrValue]
    return_components: bool
    best_paths: _containers.RepeatedCompositeFieldContainer[ElementRef]
    backend: str
    retain: _containers.RepeatedScalarFieldContainer[str]
    hooks: _containers.RepeatedCompositeFieldContainer[HookAttachment]
    output_region: SharedMemoryRegion
    semirings: _containers.RepeatedScalarFieldContainer[str]
    best_path_all: bool
    top_paths: int
    def __init__(self, graph_id: _Optional[str] = ..., inputs: _Optional[_Mapping[str, Tensor]] = ..., wrt: _Optional[_Iterable[str]] = ..., seeds: _Optional[_Mapping[str, Tensor]] = ..., outputs: _Optional[_Iterable[str]] = ..., return_outputs: _Optional[bool] = ..., semiring: _Optional[str] = ..., semiring_params: _Optional[_Mapping[str, AttrValue]] = ..., return_components: _Optional[bool] = ..., best_paths: _Optional[_Iterable[_Union[ElementRef, _Mapping]]] = ..., backend: _Optional[str] = ..., retain: _Optional[_Iterable[str]] = ..., hooks: _Optional[_Iterable[_Union[HookAttachment, _Mapping]]] = ..., output_region: _Optional[_Union[SharedMemoryRegion, _Mapping]] = ..., semirings: _Optional[_Iterable[str]] = ..., best_path_all: _Optional[bool] = ..., top_paths: _Optional[int] = ...) -> None: ...

class HookAttachment(_message.Message):
    __slots__ = ("node", "hook", "kind", "params", "client")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttrValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrValue, _Mapping]] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    HOOK_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    node: str
    hook: str
    kind: str
    params: _containers.MessageMap[str, AttrValue]
    client: bool
    def __init__(self, node: _Optional[str] = ..., hook: _Optional[str] = ..., kind: _Optional[str] = ..., params: _Optional[_Mapping[str, AttrValue]] = ..., client: _Optional[bool] = ...) -> None: ...

class ElementRef(_message.Message):
    __slots__ = ("input", "index")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    input: str
    index: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, input: _Optional[str] = ..., index: _Optional[_Iterable[int]] = ...) -> None: ...

class Tensors(_message.Message):
    __slots__ = ("tensors",)
    class TensorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.MessageMap[str, Tensor]
    def __init__(self, tensors: _Optional[_Mapping[str, Tensor]] = ...) -> None: ...

class PathTable(_message.Message):
    __slots__ = ("nodes", "shapes", "outputs", "batch_shape", "columns", "values")
    class ColumnsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    NODES_FIELD_NUMBER: _ClassVar[int]
    SHAPES_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SHAPE_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    shapes: _containers.RepeatedCompositeFieldContainer[IntList]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    batch_shape: _containers.RepeatedScalarFieldContainer[int]
    columns: _containers.MessageMap[str, Tensor]
    values: _containers.MessageMap[str, Tensor]
    def __init__(self, nodes: _Optional[_Iterable[str]] = ..., shapes: _Optional[_Iterable[_Union[IntList, _Mapping]]] = ..., outputs: _Optional[_Iterable[str]] = ..., batch_shape: _Optional[_Iterable[int]] = ..., columns: _Optional[_Mapping[str, Tensor]] = ..., values: _Optional[_Mapping[str, Tensor]] = ...) -> None: ...

class GradientResponse(_message.Message):
    __slots__ = ("gradients", "outputs", "components", "retained", "records", "semirings", "paths")
    class GradientsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    class OutputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensors
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensors, _Mapping]] = ...) -> None: ...
    class RetainedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    class RecordsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensors
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensors, _Mapping]] = ...) -> None: ...
    class SemiringsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: GradientResponse
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[GradientResponse, _Mapping]] = ...) -> None: ...
    GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    RETAINED_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    SEMIRINGS_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    gradients: _containers.MessageMap[str, Tensor]
    outputs: _containers.MessageMap[str, Tensor]
    components: _containers.MessageMap[str, Tensors]
    retained: _containers.MessageMap[str, Tensor]
    records: _containers.MessageMap[str, Tensors]
    semirings: _containers.MessageMap[str, GradientResponse]
    paths: PathTable
    def __init__(self, gradients: _Optional[_Mapping[str, Tensor]] = ..., outputs: _Optional[_Mapping[str, Tensor]] = ..., components: _Optional[_Mapping[str, Tensors]] = ..., retained: _Optional[_Mapping[str, Tensor]] = ..., records: _Optional[_Mapping[str, Tensors]] = ..., semirings: _Optional[_Mapping[str, GradientResponse]] = ..., paths: _Optional[_Union[PathTable, _Mapping]] = ...) -> None: ...

class ListSemiringsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SemiringInfo(_message.Message):
    __slots__ = ("name", "distribution", "version", "entry_point", "status", "error", "description", "commutative", "idempotent", "selective", "components", "component_names", "primary", "parameters")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENTRY_POINT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    COMMUTATIVE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    SELECTIVE_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    COMPONENT_NAMES_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    distribution: str
    version: str
    entry_point: str
    status: str
    error: str
    description: str
    commutative: bool
    idempotent: bool
    selective: bool
    components: int
    component_names: _containers.RepeatedScalarFieldContainer[str]
    primary: str
    parameters: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., distribution: _Optional[str] = ..., version: _Optional[str] = ..., entry_point: _Optional[str] = ..., status: _Optional[str] = ..., error: _Optional[str] = ..., description: _Optional[str] = ..., commutative: _Optional[bool] = ..., idempotent: _Optional[bool] = ..., selective: _Optional[bool] = ..., components: _Optional[int] = ..., component_names: _Optional[_Iterable[str]] = ..., primary: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListSemiringsResponse(_message.Message):
    __slots__ = ("semirings",)
    SEMIRINGS_FIELD_NUMBER: _ClassVar[int]
    semirings: _containers.RepeatedCompositeFieldContainer[SemiringInfo]
    def __init__(self, semirings: _Optional[_Iterable[_Union[SemiringInfo, _Mapping]]] = ...) -> None: ...

class GetGraphRequest(_message.Message):
    __slots__ = ("graph_id",)
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    graph_id: str
    def __init__(self, graph_id: _Optional[str] = ...) -> None: ...

class GetGraphResponse(_message.Message):
    __slots__ = ("graph_id", "graph", "types", "custom_ops")
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_OPS_FIELD_NUMBER: _ClassVar[int]
    graph_id: str
    graph: Graph
    types: _containers.RepeatedCompositeFieldContainer[NodeType]
    custom_ops: _containers.RepeatedCompositeFieldContainer[OpInfo]
    def __init__(self, graph_id: _Optional[str] = ..., graph: _Optional[_Union[Graph, _Mapping]] = ..., types: _Optional[_Iterable[_Union[NodeType, _Mapping]]] = ..., custom_ops: _Optional[_Iterable[_Union[OpInfo, _Mapping]]] = ...) -> None: ...

class DeleteGraphRequest(_message.Message):
    __slots__ = ("graph_id",)
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    graph_id: str
    def __init__(self, graph_id: _Optional[str] = ...) -> None: ...

class DeleteGraphResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class ListOpsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AttrSpec(_message.Message):
    __slots__ = ("name", "kind", "required", "doc")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    DOC_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    required: bool
    doc: str
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., required: _Optional[bool] = ..., doc: _Optional[str] = ...) -> None: ...

class DerivativeRule(_message.Message):
    __slots__ = ("operand", "formula")
    OPERAND_FIELD_NUMBER: _ClassVar[int]
    FORMULA_FIELD_NUMBER: _ClassVar[int]
    operand: str
    formula: str
    def __init__(self, operand: _Optional[str] = ..., formula: _Optional[str] = ...) -> None: ...

class OpInfo(_message.Message):
    __slots__ = ("name", "arity", "operands", "attrs", "kind", "expression", "derivatives", "doc")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARITY_FIELD_NUMBER: _ClassVar[int]
    OPERANDS_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    DERIVATIVES_FIELD_NUMBER: _ClassVar[int]
    DOC_FIELD_NUMBER: _ClassVar[int]
    name: str
    arity: int
    operands: _containers.RepeatedScalarFieldContainer[str]
    attrs: _containers.RepeatedCompositeFieldContainer[AttrSpec]
    kind: str
    expression: str
    derivatives: _containers.RepeatedCompositeFieldContainer[DerivativeRule]
    doc: str
    def __init__(self, name: _Optional[str] = ..., arity: _Optional[int] = ..., operands: _Optional[_Iterable[str]] = ..., attrs: _Optional[_Iterable[_Union[AttrSpec, _Mapping]]] = ..., kind: _Optional[str] = ..., expression: _Optional[str] = ..., derivatives: _Optional[_Iterable[_Union[DerivativeRule, _Mapping]]] = ..., doc: _Optional[str] = ...) -> None: ...

class ListOpsResponse(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[OpInfo]
    def __init__(self, ops: _Optional[_Iterable[_Union[OpInfo, _Mapping]]] = ...) -> None: ...

class CrossCheckRequest(_message.Message):
    __slots__ = ("graph_id", "inputs", "wrt", "outputs", "methods", "atol", "rtol", "step", "richardson", "semiring", "semiring_params", "localize")
    class InputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    class SemiringParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttrValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrValue, _Mapping]] = ...) -> None: ...
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    WRT_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    METHODS_FIELD_NUMBER: _ClassVar[int]
    ATOL_FIELD_NUMBER: _ClassVar[int]
    RTOL_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RICHARDSON_FIELD_NUMBER: _ClassVar[int]
    SEMIRING_FIELD_NUMBER: _ClassVar[int]
    SEMIRING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    LOCALIZE_FIELD_NUMBER: _ClassVar[int]
    graph_id: str
    inputs: _containers.MessageMap[str, Tensor]
    wrt: _containers.RepeatedScalarFieldContainer[str]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    methods: _containers.RepeatedScalarFieldContainer[str]
    atol: float
    rtol: float
    step: float
    richardson: bool
    semiring: str
    semiring_params: _containers.MessageMap[str, AttrValue]
    localize: bool
    def __init__(self, graph_id: _Optional[str] = ..., inputs: _Optional[_Mapping[str, Tensor]] = ..., wrt: _Optional[_Iterable[str]] = ..., outputs: _Optional[_Iterable[str]] = ..., methods: _Optional[_Iterable[str]] = ..., atol: _Optional[float] = ..., rtol: _Optional[float] = ..., step: _Optional[float] = ..., richardson: _Optional[bool] = ..., semiring: _Optional[str] = ..., semiring_params: _Optional[_Mapping[str, AttrValue]] = ..., localize: _Optional[bool] = ...) -> None: ...

class DerivativeBlock(_message.Message):
    __slots__ = ("output", "input", "value")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    output: str
    input: str
    value: Tensor
    def __init__(self, output: _Optional[str] = ..., input: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class MethodReport(_message.Message):
    __slots__ = ("method", "ran", "detail", "seconds", "blocks")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    RAN_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    method: str
    ran: bool
    detail: str
    seconds: float
    blocks: _containers.RepeatedCompositeFieldContainer[DerivativeBlock]
    def __init__(self, method: _Optional[str] = ..., ran: _Optional[bool] = ..., detail: _Optional[str] = ..., seconds: _Optional[float] = ..., blocks: _Optional[_Iterable[_Union[DerivativeBlock, _Mapping]]] = ...) -> None: ...

class BlockComparison(_message.Message):
    __slots__ = ("output", "input", "abs_error", "rel_error", "max_abs_error", "max_rel_error", "worst", "worst_value", "worst_reference", "passed")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    ABS_ERROR_FIELD_NUMBER: _ClassVar[int]
    REL_ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_REL_ERROR_FIELD_NUMBER: _ClassVar[int]
    WORST_FIELD_NUMBER: _ClassVar[int]
    WORST_VALUE_FIELD_NUMBER: _ClassVar[int]
    WORST_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    output: str
    input: str
    abs_error: Tensor
    rel_error: Tensor
    max_abs_error: float
    max_rel_error: float
    worst: _containers.RepeatedScalarFieldContainer[int]
    worst_value: float
    worst_reference: float
    passed: bool
    def __init__(self, output: _Optional[str] = ..., input: _Optional[str] = ..., abs_error: _Optional[_Union[Tensor, _Mapping]] = ..., rel_error: _Optional[_Union[Tensor, _Mapping]] = ..., max_abs_error: _Optional[float] = ..., max_rel_error: _Optional[float] = ..., worst: _Optional[_Iterable[int]] = ..., worst_value: _Optional[float] = ..., worst_reference: _Optional[float] = ..., passed: _Optional[bool] = ...) -> None: ...

class MethodComparison(_message.Message):
    __slots__ = ("method", "reference", "passed", "max_abs_error", "max_rel_error", "blocks")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_REL_ERROR_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    method: str
    reference: str
    passed: bool
    max_abs_error: float
    max_rel_error: float
    blocks: _containers.RepeatedCompositeFieldContainer[BlockComparison]
    def __init__(self, method: _Optional[str] = ..., reference: _Optional[str] = ..., passed: _Optional[bool] = ..., max_abs_error: _Optional[float] = ..., max_rel_error: _Optional[float] = ..., blocks: _Optional[_Iterable[_Union[BlockComparison, _Mapping]]] = ...) -> None: ...

class NodeCheck(_message.Message):
    __slots__ = ("node", "op", "position", "operand", "source", "rule", "checked", "passed", "max_abs_error", "max_rel_error", "detail")
    NODE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    OPERAND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    CHECKED_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_REL_ERROR_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    node: str
    op: str
    position: int
    operand: str
    source: str
    rule: str
    checked: bool
    passed: bool
    max_abs_error: float
    max_rel_error: float
    detail: str
    def __init__(self, node: _Optional[str] = ..., op: _Optional[str] = ..., position: _Optional[int] = ..., operand: _Optional[str] = ..., source: _Optional[str] = ..., rule: _Optional[str] = ..., checked: _Optional[bool] = ..., passed: _Optional[bool] = ..., max_abs_error: _Optional[float] = ..., max_rel_error: _Optional[float] = ..., detail: _Optional[str] = ...) -> None: ...

class CrossCheckResponse(_message.Message):
    __slots__ = ("passed", "semiring", "atol", "rtol", "methods", "comparisons", "localized", "node_checks", "suspects", "text")
    PASSED_FIELD_NUMBER: _ClassVar[int]
    SEMIRING_FIELD_NUMBER: _ClassVar[int]
    ATOL_FIELD_NUMBER: _ClassVar[int]
    RTOL_FIELD_NUMBER: _ClassVar[int]
    METHODS_FIELD_NUMBER: _ClassVar[int]
    COMPARISONS_FIELD_NUMBER: _ClassVar[int]
    LOCALIZED_FIELD_NUMBER: _ClassVar[int]
    NODE_CHECKS_FIELD_NUMBER: _ClassVar[int]
    SUSPECTS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    passed: bool
    semiring: str
    atol: float
    rtol: float
    methods: _containers.RepeatedCompositeFieldContainer[MethodReport]
    comparisons: _containers.RepeatedCompositeFieldContainer[MethodComparison]
    localized: bool
    node_checks: _containers.RepeatedCompositeFieldContainer[NodeCheck]
    suspects: _containers.RepeatedScalarFieldContainer[str]
    text: str
    def __init__(self, passed: _Optional[bool] = ..., semiring: _Optional[str] = ..., atol: _Optional[float] = ..., rtol: _Optional[float] = ..., methods: _Optional[_Iterable[_Union[MethodReport, _Mapping]]] = ..., comparisons: _Optional[_Iterable[_Union[MethodComparison, _Mapping]]] = ..., localized: _Optional[bool] = ..., node_checks: _Optional[_Iterable[_Union[NodeCheck, _Mapping]]] = ..., suspects: _Optional[_Iterable[str]] = ..., text: _Optional[str] = ...) -> None: ...

class SymbolicGradientRequest(_message.Message):
    __slots__ = ("graph_id", "wrt", "outputs", "no_simplify")
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    WRT_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    NO_SIMPLIFY_FIELD_NUMBER: _ClassVar[int]
    graph_id: str
    wrt: _containers.RepeatedScalarFieldContainer[str]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    no_simplify: bool
    def __init__(self, graph_id: _Optional[str] = ..., wrt: _Optional[_Iterable[str]] = ..., outputs: _Optional[_Iterable[str]] = ..., no_simplify: _Optional[bool] = ...) -> None: ...

class Formula(_message.Message):
    __slots__ = ("text", "latex")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LATEX_FIELD_NUMBER: _ClassVar[int]
    text: str
    latex: str
    def __init__(self, text: _Optional[str] = ..., latex: _Optional[str] = ...) -> None: ...

class FormulaBlock(_message.Message):
    __slots__ = ("output", "input", "shape", "formulas")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    FORMULAS_FIELD_NUMBER: _ClassVar[int]
    output: str
    input: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    formulas: _containers.RepeatedCompositeFieldContainer[Formula]
    def __init__(self, output: _Optional[str] = ..., input: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., formulas: _Optional[_Iterable[_Union[Formula, _Mapping]]] = ...) -> None: ...

class SymbolicGradientResponse(_message.Message):
    __slots__ = ("outputs", "derivatives", "python", "simplified", "detail")
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    DERIVATIVES_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    SIMPLIFIED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[FormulaBlock]
    derivatives: _containers.RepeatedCompositeFieldContainer[FormulaBlock]
    python: str
    simplified: bool
    detail: str
    def __init__(self, outputs: _Optional[_Iterable[_Union[FormulaBlock, _Mapping]]] = ..., derivatives: _Optional[_Iterable[_Union[FormulaBlock, _Mapping]]] = ..., python: _Optional[str] = ..., simplified: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class GradientStreamRequest(_message.Message):
    __slots__ = ("chunk", "request")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    chunk: int
    request: GradientRequest
    def __init__(self, chunk: _Optional[int] = ..., request: _Optional[_Union[GradientRequest, _Mapping]] = ...) -> None: ...

class GradientStreamResponse(_message.Message):
    __slots__ = ("chunk", "response", "code", "message", "max_items")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_ITEMS_FIELD_NUMBER: _ClassVar[int]
    chunk: int
    response: GradientResponse
    code: int
    message: str
    max_items: int
    def __init__(self, chunk: _Optional[int] = ..., response: _Optional[_Union[GradientResponse, _Mapping]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., max_items: _Optional[int] = ...) -> None: ...

class HookStreamRequest(_message.Message):
    __slots__ = ("start", "reply")
    START_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    start: GradientRequest
    reply: HookReply
    def __init__(self, start: _Optional[_Union[GradientRequest, _Mapping]] = ..., reply: _Optional[_Union[HookReply, _Mapping]] = ...) -> None: ...

class HookReply(_message.Message):
    __slots__ = ("call", "value", "error")
    CALL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    call: int
    value: Tensor
    error: str
    def __init__(self, call: _Optional[int] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class HookContribution(_message.Message):
    __slots__ = ("consumer", "operand", "value")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    OPERAND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    operand: int
    value: Tensor
    def __init__(self, consumer: _Optional[str] = ..., operand: _Optional[int] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class HookCall(_message.Message):
    __slots__ = ("call", "node", "kind", "contributions")
    CALL_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    call: int
    node: str
    kind: str
    contributions: _containers.RepeatedCompositeFieldContainer[HookContribution]
    def __init__(self, call: _Optional[int] = ..., node: _Optional[str] = ..., kind: _Optional[str] = ..., contributions: _Optional[_Iterable[_Union[HookContribution, _Mapping]]] = ...) -> None: ...

class HookStreamResponse(_message.Message):
    __slots__ = ("call", "result")
    CALL_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    call: HookCall
    result: GradientResponse
    def __init__(self, call: _Optional[_Union[HookCall, _Mapping]] = ..., result: _Optional[_Union[GradientResponse, _Mapping]] = ...) -> None: ...

class ListHooksRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HookInfo(_message.Message):
    __slots__ = ("name", "description", "parameters", "distribution", "status", "error")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters: _containers.ScalarMap[str, str]
    distribution: str
    status: str
    error: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ..., distribution: _Optional[str] = ..., status: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class ListHooksResponse(_message.Message):
    __slots__ = ("hooks",)
    HOOKS_FIELD_NUMBER: _ClassVar[int]
    hooks: _containers.RepeatedCompositeFieldContainer[HookInfo]
    def __init__(self, hooks: _Optional[_Iterable[_Union[HookInfo, _Mapping]]] = ...) -> None: ...

class DescribeGraphRequest(_message.Message):
    __slots__ = ("graph_id", "semiring", "semiring_params", "wrt", "outputs")
    class SemiringParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttrValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrValue, _Mapping]] = ...) -> None: ...
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    SEMIRING_FIELD_NUMBER: _ClassVar[int]
    SEMIRING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    WRT_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    graph_id: str
    semiring: str
    semiring_params: _containers.MessageMap[str, AttrValue]
    wrt: _containers.RepeatedScalarFieldContainer[str]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, graph_id: _Optional[str] = ..., semiring: _Optional[str] = ..., semiring_params: _Optional[_Mapping[str, AttrValue]] = ..., wrt: _Optional[_Iterable[str]] = ..., outputs: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeDerivative(_message.Message):
    __slots__ = ("position", "operand", "source", "formula")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    OPERAND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FORMULA_FIELD_NUMBER: _ClassVar[int]
    position: int
    operand: str
    source: str
    formula: str
    def __init__(self, position: _Optional[int] = ..., operand: _Optional[str] = ..., source: _Optional[str] = ..., formula: _Optional[str] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("id", "op", "inputs", "consumers", "shape", "dtype", "attrs", "leaf", "requires_grad", "outputs", "expression", "derivatives")
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    LEAF_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_GRAD_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    DERIVATIVES_FIELD_NUMBER: _ClassVar[int]
    id: str
    op: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    consumers: _containers.RepeatedScalarFieldContainer[str]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    attrs: _containers.ScalarMap[str, str]
    leaf: bool
    requires_grad: bool
    outputs: _containers.RepeatedScalarFieldContainer[str]
    expression: str
    derivatives: _containers.RepeatedCompositeFieldContainer[NodeDerivative]
    def __init__(self, id: _Optional[str] = ..., op: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., consumers: _Optional[_Iterable[str]] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ..., attrs: _Optional[_Mapping[str, str]] = ..., leaf: _Optional[bool] = ..., requires_grad: _Optional[bool] = ..., outputs: _Optional[_Iterable[str]] = ..., expression: _Optional[str] = ..., derivatives: _Optional[_Iterable[_Union[NodeDerivative, _Mapping]]] = ...) -> None: ...

class BackwardNode(_message.Message):
    __slots__ = ("id", "op", "inputs", "attrs", "shape", "dtype")
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    id: str
    op: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    attrs: _containers.ScalarMap[str, str]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    def __init__(self, id: _Optional[str] = ..., op: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., attrs: _Optional[_Mapping[str, str]] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ...) -> None: ...

class BackwardGraphInfo(_message.Message):
    __slots__ = ("semiring", "wrt", "outputs", "nodes", "gradients", "adjoints", "seeds")
    class GradientsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AdjointsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SeedsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEMIRING_FIELD_NUMBER: _ClassVar[int]
    WRT_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    ADJOINTS_FIELD_NUMBER: _ClassVar[int]
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    semiring: str
    wrt: _containers.RepeatedScalarFieldContainer[str]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    nodes: _containers.RepeatedCompositeFieldContainer[BackwardNode]
    gradients: _containers.ScalarMap[str, str]
    adjoints: _containers.ScalarMap[str, str]
    seeds: _containers.ScalarMap[str, str]
    def __init__(self, semiring: _Optional[str] = ..., wrt: _Optional[_Iterable[str]] = ..., outputs: _Optional[_Iterable[str]] = ..., nodes: _Optional[_Iterable[_Union[BackwardNode, _Mapping]]] = ..., gradients: _Optional[_Mapping[str, str]] = ..., adjoints: _Optional[_Mapping[str, str]] = ..., seeds: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DescribeGraphResponse(_message.Message):
    __slots__ = ("graph_id", "nodes", "outputs", "wrt", "backward")
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    WRT_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_FIELD_NUMBER: _ClassVar[int]
    graph_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    outputs: _containers.RepeatedCompositeFieldContainer[GraphOutput]
    wrt: _containers.RepeatedScalarFieldContainer[str]
    backward: BackwardGraphInfo
    def __init__(self, graph_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[GraphOutput, _Mapping]]] = ..., wrt: _Optional[_Iterable[str]] = ..., backward: _Optional[_Union[BackwardGraphInfo, _Mapping]] = ...) -> None: ...

class NodeElement(_message.Message):
    __slots__ = ("node", "index")
    NODE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    node: str
    index: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node: _Optional[str] = ..., index: _Optional[_Iterable[int]] = ...) -> None: ...

class DrawGraphRequest(_message.Message):
    __slots__ = ("graph_id", "inputs", "semiring", "semiring_params", "wrt", "values", "gradients", "highlight")
    class InputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    class SemiringParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttrValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttrValue, _Mapping]] = ...) -> None: ...
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    class GradientsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    SEMIRING_FIELD_NUMBER: _ClassVar[int]
    SEMIRING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    WRT_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    HIGHLIGHT_FIELD_NUMBER: _ClassVar[int]
    graph_id: str
    inputs: _containers.MessageMap[str, Tensor]
    semiring: str
    semiring_params: _containers.MessageMap[str, AttrValue]
    wrt: _containers.RepeatedScalarFieldContainer[str]
    values: _containers.MessageMap[str, Tensor]
    gradients: _containers.MessageMap[str, Tensor]
    highlight: _containers.RepeatedCompositeFieldContainer[NodeElement]
    def __init__(self, graph_id: _Optional[str] = ..., inputs: _Optional[_Mapping[str, Tensor]] = ..., semiring: _Optional[str] = ..., semiring_params: _Optional[_Mapping[str, AttrValue]] = ..., wrt: _Optional[_Iterable[str]] = ..., values: _Optional[_Mapping[str, Tensor]] = ..., gradients: _Optional[_Mapping[str, Tensor]] = ..., highlight: _Optional[_Iterable[_Union[NodeElement, _Mapping]]] = ...) -> None: ...

class DrawGraphResponse(_message.Message):
    __slots__ = ("dot",)
    DOT_FIELD_NUMBER: _ClassVar[int]
    dot: str
    def __init__(self, dot: _Optional[str] = ...) -> None: ...
