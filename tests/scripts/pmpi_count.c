/* A PMPI counting shim: LD_PRELOAD'ed into an MPI job, it counts what each
 * process hands MPI (point-to-point sends and their bytes; collective calls
 * and the bytes each contributes) and passes every call on to PMPI_*.
 * pmpi_counts(out[6]) reads the counters: sends, send bytes, collective
 * calls, collective bytes, receives posted, and the bytes the process's
 * allgathers receive (every rank's records: what grows with N). Built by
 * tests/test_scale_counts.py with the system mpicc. */
#include <mpi.h>

static long long n_sends, send_bytes, n_colls, coll_bytes, n_recvs, gathered_bytes;

static long long bytes_of(long long count, MPI_Datatype type) {
    int size = 0;
    if (type == MPI_DATATYPE_NULL) return 0;
    PMPI_Type_size(type, &size);
    return (long long)count * size;
}

void pmpi_counts(long long out[6]) {
    out[0] = n_sends; out[1] = send_bytes; out[2] = n_colls; out[3] = coll_bytes; out[4] = n_recvs;
    out[5] = gathered_bytes;
}

static long long comm_size(MPI_Comm comm) {
    int size = 0;
    PMPI_Comm_size(comm, &size);
    return size;
}

static long long sum_of(const int counts[], MPI_Comm comm) {
    long long total = 0;
    for (long long i = 0; i < comm_size(comm); i++) total += counts[i];
    return total;
}

#define SEND(name, ...) n_sends++; send_bytes += bytes_of(count, datatype); return P##name(__VA_ARGS__)

int MPI_Send(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm) {
    SEND(MPI_Send, buf, count, datatype, dest, tag, comm);
}
int MPI_Ssend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm) {
    SEND(MPI_Ssend, buf, count, datatype, dest, tag, comm);
}
int MPI_Bsend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm) {
    SEND(MPI_Bsend, buf, count, datatype, dest, tag, comm);
}
int MPI_Rsend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm) {
    SEND(MPI_Rsend, buf, count, datatype, dest, tag, comm);
}
int MPI_Isend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm,
              MPI_Request *request) {
    SEND(MPI_Isend, buf, count, datatype, dest, tag, comm, request);
}
int MPI_Issend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm,
               MPI_Request *request) {
    SEND(MPI_Issend, buf, count, datatype, dest, tag, comm, request);
}
int MPI_Irecv(void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
              MPI_Request *request) {
    n_recvs++;
    return PMPI_Irecv(buf, count, datatype, source, tag, comm, request);
}
int MPI_Recv(void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
             MPI_Status *status) {
    n_recvs++;
    return PMPI_Recv(buf, count, datatype, source, tag, comm, status);
}

int MPI_Barrier(MPI_Comm comm) {
    n_colls++;
    return PMPI_Barrier(comm);
}
int MPI_Ibarrier(MPI_Comm comm, MPI_Request *request) {
    n_colls++;
    return PMPI_Ibarrier(comm, request);
}
int MPI_Bcast(void *buf, int count, MPI_Datatype datatype, int root, MPI_Comm comm) {
    int rank = 0;
    PMPI_Comm_rank(comm, &rank);
    n_colls++;
    if (rank == root) coll_bytes += bytes_of(count, datatype);
    return PMPI_Bcast(buf, count, datatype, root, comm);
}
int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                  MPI_Comm comm) {
    n_colls++;
    coll_bytes += bytes_of(count, datatype);
    return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}
int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
    n_colls++;
    coll_bytes += bytes_of(sendcount, sendtype);
    gathered_bytes += bytes_of(recvcount, recvtype) * comm_size(comm);
    return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}
int MPI_Iallgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                   int recvcount, MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request) {
    n_colls++;
    coll_bytes += bytes_of(sendcount, sendtype);
    gathered_bytes += bytes_of(recvcount, recvtype) * comm_size(comm);
    return PMPI_Iallgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, request);
}
int MPI_Allgatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                   const int recvcounts[], const int displs[], MPI_Datatype recvtype, MPI_Comm comm) {
    n_colls++;
    coll_bytes += bytes_of(sendcount, sendtype);
    gathered_bytes += bytes_of(sum_of(recvcounts, comm), recvtype);
    return PMPI_Allgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm);
}
int MPI_Iallgatherv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                    const int recvcounts[], const int displs[], MPI_Datatype recvtype, MPI_Comm comm,
                    MPI_Request *request) {
    n_colls++;
    coll_bytes += bytes_of(sendcount, sendtype);
    gathered_bytes += bytes_of(sum_of(recvcounts, comm), recvtype);
    return PMPI_Iallgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm,
                            request);
}
