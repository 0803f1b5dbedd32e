/* Real-symbol wrappers for libfabric's static inline API.
 *
 * libfabric implements most of its API as static inline functions that call
 * through the provider's ops tables; they have no symbol to link against.
 * Each ddfi_* function below forwards to the inline function of the same
 * name, so Rust can call it through an ordinary FFI declaration. */
#ifndef DDFI_SHIM_H
#define DDFI_SHIM_H

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

struct fi_info *ddfi_allocinfo(void);
int ddfi_close(struct fid *fid);
int ddfi_control(struct fid *fid, int command, void *arg);

int ddfi_domain(struct fid_fabric *fabric, struct fi_info *info,
		struct fid_domain **domain, void *context);
int ddfi_endpoint(struct fid_domain *domain, struct fi_info *info,
		  struct fid_ep **ep, void *context);
int ddfi_av_open(struct fid_domain *domain, struct fi_av_attr *attr,
		 struct fid_av **av, void *context);
int ddfi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr,
		 struct fid_cq **cq, void *context);

int ddfi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags);
int ddfi_enable(struct fid_ep *ep);
ssize_t ddfi_cancel(struct fid *fid, void *context);
int ddfi_getname(struct fid *fid, void *addr, size_t *addrlen);
int ddfi_av_insert(struct fid_av *av, const void *addr, size_t count,
		   fi_addr_t *fi_addr, uint64_t flags, void *context);

int ddfi_mr_reg(struct fid_domain *domain, const void *buf, size_t len,
		uint64_t access, uint64_t offset, uint64_t requested_key,
		uint64_t flags, struct fid_mr **mr, void *context);
int ddfi_mr_regattr(struct fid_domain *domain, const struct fi_mr_attr *attr,
		    uint64_t flags, struct fid_mr **mr);
uint64_t ddfi_mr_key(struct fid_mr *mr);
void *ddfi_mr_desc(struct fid_mr *mr);
int ddfi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags);
int ddfi_mr_enable(struct fid_mr *mr);

ssize_t ddfi_read(struct fid_ep *ep, void *buf, size_t len, void *desc,
		  fi_addr_t src_addr, uint64_t addr, uint64_t key, void *context);

int ddfi_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count,
		   uint64_t flags);
ssize_t ddfi_trecvv(struct fid_ep *ep, const struct iovec *iov, void **desc,
		    size_t count, fi_addr_t src_addr, uint64_t tag,
		    uint64_t ignore, void *context);
ssize_t ddfi_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc,
		   fi_addr_t src_addr, uint64_t tag, uint64_t ignore,
		   void *context);
ssize_t ddfi_tsend(struct fid_ep *ep, const void *buf, size_t len, void *desc,
		   fi_addr_t dest_addr, uint64_t tag, void *context);
ssize_t ddfi_tsendv(struct fid_ep *ep, const struct iovec *iov, void **desc,
		    size_t count, fi_addr_t dest_addr, uint64_t tag,
		    void *context);
ssize_t ddfi_tsendv_data(struct fid_ep *ep, const struct iovec *iov,
			 void **desc, size_t count, fi_addr_t dest_addr,
			 uint64_t data, uint64_t tag, void *context);

ssize_t ddfi_cq_read(struct fid_cq *cq, void *buf, size_t count);
ssize_t ddfi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf,
			uint64_t flags);
ssize_t ddfi_cq_sread(struct fid_cq *cq, void *buf, size_t count,
		      const void *cond, int timeout);
int ddfi_cq_signal(struct fid_cq *cq);
const char *ddfi_cq_strerror(struct fid_cq *cq, int prov_errno,
			     const void *err_data, char *buf, size_t len);

#endif
