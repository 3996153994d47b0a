//! The L-Bone over TLS, with a CA made here (`rcgen`): depots register
//! and clients query over https, verified against that CA; a server signed
//! by another CA is refused with an error that says what to do; the token
//! never goes in clear to another machine unless asked.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::util::{DepotProc, LboneProc, lors_cmd, lors_env, pattern, tempdir};

/// A CA, and a certificate it signed for 127.0.0.1 and localhost: writes
/// `ca.pem`, `server.pem`, `server.key` into `dir`.
fn make_ca(dir: &Path, name: &str) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, format!("{name} test CA"));
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let server =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), server.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
}

#[test]
fn registration_and_queries_over_https_are_verified() {
    let dir = tempdir();
    let (ours, theirs) = (dir.path().join("ours"), dir.path().join("theirs"));
    make_ca(&ours, "our");
    make_ca(&theirs, "another");
    let pem = |d: &Path, f: &str| d.join(f).display().to_string();
    let lb = LboneProc::start(
        &dir.path().join("lb"),
        &[
            "--tls-cert",
            &pem(&ours, "server.pem"),
            "--tls-key",
            &pem(&ours, "server.key"),
        ],
    );
    assert!(lb.url().starts_with("https://127.0.0.1:"), "{}", lb.url());
    let depot_with = |name: &str, ca: &Path| {
        DepotProc::start(
            &dir.path().join(name),
            &[
                "--size",
                "64M",
                "--lbone",
                &lb.url(),
                "--lbone-token",
                &lb.token,
                "--lbone-ca-file",
                &pem(ca, "ca.pem"),
                "--heartbeat",
                "1s",
                "--city",
                name,
            ],
        )
    };
    let good = depot_with("Brno", &ours);
    // Another CA's depot cannot verify the L-Bone: it serves, unlisted.
    let _unverified = depot_with("Praha", &theirs);

    // A client trusting our CA finds the depot and uploads through it.
    let src = dir.path().join("src");
    std::fs::write(&src, pattern(50_000, 4)).unwrap();
    let xnd = dir.path().join("src.xnd");
    let upload = |ca: &Path, location: &str| {
        let _ = std::fs::remove_file(&xnd);
        lors_env(
            &[
                "upload",
                "-H",
                &lb.url(),
                "--copies",
                "1",
                "-l",
                location,
                "-o",
                xnd.to_str().unwrap(),
                src.to_str().unwrap(),
            ],
            &[("LORS_CA_FILE", &pem(ca, "ca.pem"))],
        )
    };
    let t = Instant::now();
    loop {
        let (ok, _, err) = upload(&ours, "city= Brno");
        if ok {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{err}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let x = lors_exnode::xml::parse(&std::fs::read(&xnd).unwrap()).unwrap();
    assert!(
        x.mappings
            .iter()
            .all(|m| m.depot().as_deref() == Some(good.addr.as_str())),
        "the verified depot holds it"
    );
    // The depot that could not verify the L-Bone never got listed: asked
    // for Prague, the L-Bone can only offer Brno.
    let (ok, _, err) = upload(&ours, "city= Praha");
    assert!(ok, "{err}");
    let x = lors_exnode::xml::parse(&std::fs::read(&xnd).unwrap()).unwrap();
    assert!(
        x.mappings
            .iter()
            .all(|m| m.depot().as_deref() == Some(good.addr.as_str())),
        "only the verified depot is listed"
    );

    // --ca-file does what LORS_CA_FILE does; a file with no certificate
    // in it stops the command before anything is asked.
    let ca_flag = |ca: &str| {
        let _ = std::fs::remove_file(&xnd);
        lors_env(
            &[
                "upload",
                "-H",
                &lb.url(),
                "--ca-file",
                ca,
                "--copies",
                "1",
                "-l",
                "city= Brno",
                "-o",
                xnd.to_str().unwrap(),
                src.to_str().unwrap(),
            ],
            &[],
        )
    };
    let (ok, _, err) = ca_flag(&pem(&ours, "ca.pem"));
    assert!(ok, "{err}");
    let (ok, _, err) = ca_flag(src.to_str().unwrap());
    assert!(!ok);
    assert!(
        err.contains("--ca-file") && err.contains("no certificate"),
        "{err}"
    );

    // A client trusting another CA is refused, and told what to do.
    let (ok, _, err) = upload(&theirs, "city= Brno");
    assert!(!ok);
    assert!(err.contains("--ca-file or LORS_CA_FILE"), "{err}");

    // The token is not sent in clear to another machine unless asked.
    let out = lors_cmd(&[
        "depot",
        "--data",
        dir.path().join("clear").to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--lbone",
        "http://lbone.example.org:8767",
        "--lbone-token",
        "secret-token-1",
    ])
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("in clear") && err.contains("https://"),
        "{err}"
    );
}
