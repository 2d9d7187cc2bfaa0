void stream_init(double *a, double *b, double *c, long long n, int nthreads);
void stream_copy(double *a, const double *b, long long n, int reps, int nthreads);
void stream_scale(double *a, const double *b, double s, long long n, int reps, int nthreads);
void stream_add(double *a, const double *b, const double *c, long long n, int reps, int nthreads);
void stream_triad(double *a, const double *b, const double *c, double s, long long n, int reps, int nthreads);
void stream_read(const double *a, double *out, long long n, int reps, int nthreads);
