//! Integration tests: real `lors` processes on 127.0.0.1 with OS-assigned ports.

mod abuse;
mod bench;
mod dashboard;
mod depot;
mod diskfull;
mod dissem;
mod erasure;
mod federation;
mod flood;
mod fuse;
mod hostile;
mod hung;
mod interrupt;
mod keep;
mod keeper;
mod lab;
mod lbone;
mod lstore;
mod metrics;
mod safety;
mod share;
mod sparse;
mod tls;
mod tools;
mod util;
mod xio;
