//! Methods 1 and 2: libfabric one-sided reads (to be written).
