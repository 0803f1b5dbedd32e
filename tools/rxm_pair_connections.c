// How many TCP connections rxm keeps between two processes that each open ONE tcp;ofi_rxm
// endpoint and send to each other at the same moment (both connect at once): the question the
// shared-endpoint design in docs/developer.md ("Connections and descriptors") depends on.
//
//   gcc -O1 -o /tmp/rxm_pair tools/rxm_pair_connections.c -lfabric && FI_TCP_IFACE=lo /tmp/rxm_pair 3
//   (another libfabric: add -I$PREFIX/include -L$PREFIX/lib -Wl,-rpath,$PREFIX/lib)
//
// Each process prints its socket descriptors and its established TCP connections (`ss`) after
// the exchanges. Measured on libfabric 1.17 and 2.3.1: one connection each, every run.
// A second argument `evict` then has side 0 remove the peer from its AV and insert it again (with
// FI_AV_REMOVE_CLEANUP=1: rxm closes the connection), as the bounded set of live connections
// does, and both sides exchange once more over a new connection. A round that does not complete
// within 5 s is reported (exit status 2).
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                        \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_) {                                                                         \
            fprintf(stderr, "%s: %s\n", #call, fi_strerror(-rc_));                         \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static void must_io(ssize_t got, size_t want) {
    if (got != (ssize_t)want) {
        perror("pipe");
        exit(1);
    }
}

// One side: its endpoint, the peer's name through the pipes, then `rounds` simultaneous exchanges.
static void side(int me, int to_peer, int from_peer, int rounds, int evict) {
    struct fi_info *hints = fi_allocinfo(), *info;
    hints->caps = FI_TAGGED;
    hints->ep_attr->type = FI_EP_RDM;
    hints->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
    CHECK(fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", NULL, 0, hints, &info));
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_ep *ep;
    struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .size = 64};
    CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
    CHECK(fi_domain(fabric, info, &domain, NULL));
    CHECK(fi_av_open(domain, &av_attr, &av, NULL));
    CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL));
    CHECK(fi_endpoint(domain, info, &ep, NULL));
    CHECK(fi_ep_bind(ep, &av->fid, 0));
    CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
    CHECK(fi_enable(ep));

    char name[64], peer_name[64];
    size_t len = sizeof name, peer_len;
    CHECK(fi_getname(&ep->fid, name, &len));
    must_io(write(to_peer, &len, sizeof len), sizeof len);
    must_io(write(to_peer, name, len), len);
    must_io(read(from_peer, &peer_len, sizeof peer_len), sizeof peer_len);
    must_io(read(from_peer, peer_name, peer_len), peer_len);
    fi_addr_t peer;
    if (fi_av_insert(av, peer_name, 1, &peer, 0, NULL) != 1) {
        fprintf(stderr, "fi_av_insert failed\n");
        exit(1);
    }
    char token = 0;
    must_io(write(to_peer, &token, 1), 1); // both ready: send at once
    must_io(read(from_peer, &token, 1), 1);

    for (int r = 0; r < rounds + evict; r++) {
        if (r == rounds) { // the extra round, after side 0 evicted its peer
            if (me == 0) {
                CHECK(fi_av_remove(av, &peer, 1, 0));
                if (fi_av_insert(av, peer_name, 1, &peer, 0, NULL) != 1) {
                    fprintf(stderr, "fi_av_insert after fi_av_remove failed\n");
                    exit(1);
                }
            }
            must_io(write(to_peer, &token, 1), 1);
            must_io(read(from_peer, &token, 1), 1);
        }
        char in[8], out[8] = "hello";
        while (fi_trecv(ep, in, sizeof in, NULL, peer, 7, 0, in) == -FI_EAGAIN)
            fi_cq_read(cq, NULL, 0);
        ssize_t sent;
        while ((sent = fi_tsend(ep, out, sizeof out, NULL, peer, 7, out)) == -FI_EAGAIN)
            fi_cq_read(cq, NULL, 0);
        CHECK((int)sent);
        time_t deadline = time(NULL) + 5;
        for (int done = 0; done < 2;) {
            struct fi_cq_tagged_entry entry;
            ssize_t n = fi_cq_read(cq, &entry, 1);
            if (n > 0) {
                done++;
            } else if (n == -FI_EAGAIN && time(NULL) > deadline) {
                fprintf(stderr, "side %d: round %d did not complete within 5 s (a message lost)\n",
                        me, r);
                exit(2);
            } else if (n != -FI_EAGAIN) {
                struct fi_cq_err_entry err = {0};
                fi_cq_readerr(cq, &err, 0);
                fprintf(stderr, "side %d: completion error %s\n", me, fi_strerror(err.err));
                exit(1);
            }
        }
    }
    for (int i = 0; i < 2000; i++) { // let both sides settle their connection handshakes
        fi_cq_read(cq, NULL, 0);
        usleep(100);
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "echo \"side %d: $(ls -l /proc/%d/fd | grep -c socket) socket descriptors, "
             "$(ss -tnp 2>/dev/null | grep -c 'pid=%d,') established TCP connections%s\"",
             me, (int)getpid(), (int)getpid(), evict ? " (after an eviction and one more exchange)" : "");
    if (system(cmd) != 0)
        exit(1);
    must_io(write(to_peer, &token, 1), 1); // neither closes before both counted
    must_io(read(from_peer, &token, 1), 1);
    fi_close(&ep->fid);
    fi_close(&cq->fid);
    fi_close(&av->fid);
    fi_close(&domain->fid);
    fi_close(&fabric->fid);
    fi_freeinfo(info);
    fi_freeinfo(hints);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 1;
    int evict = argc > 2 && strcmp(argv[2], "evict") == 0;
    int to_child[2], to_parent[2];
    if (pipe(to_child) || pipe(to_parent)) {
        perror("pipe");
        return 1;
    }
    pid_t child = fork();
    if (child == 0) {
        side(1, to_parent[1], to_child[0], rounds, evict);
        return 0;
    }
    side(0, to_child[1], to_parent[0], rounds, evict);
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
